"""The digest's chunks: a tensor's bytes are hashed CHUNK_BYTES at a time on several threads, and the tensor's hash
is the hash of its header and the chunks' hashes in order. Whatever the thread count, the hash is the same; any
byte, the last chunk's included, and the chunks' order change it.

Most tests shrink CHUNK_BYTES to a few KiB so that small tensors have many chunks; one runs at the real size.
"""

import pytest
import torch

from restartbench import verify
from restartbench.verify import compare, digest, hash_tensors, tensor_hash

SMALL_CHUNK = 4096


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(verify, "CHUNK_BYTES", SMALL_CHUNK)


def _bytes(count, seed=0):
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _flipped(tensor, byte):
    """A copy of ``tensor`` with one bit of its byte ``byte`` (counted in its raw bytes) flipped."""
    copy = tensor.clone()
    copy.view(-1).view(torch.uint8)[byte] ^= 1
    return copy


def _state():
    """Tensors of many chunks, none a whole number of chunks, an empty one and plain values among them."""
    generator = torch.Generator().manual_seed(1)
    return {"fp32": torch.randn(10 * SMALL_CHUNK // 4 + 7, generator=generator),
            "moments": [torch.randn(3, 5000, generator=generator).to(torch.bfloat16), torch.zeros(0)],
            "bytes": _bytes(3 * SMALL_CHUNK + 1), "small": torch.arange(3), "step": 4}


@pytest.mark.usefixtures("small_chunks")
def test_the_thread_count_changes_no_hash():
    state = _state()
    one_thread = digest(state, threads=1)
    for threads in (2, 3, 8, 64):
        assert list(digest(state, threads=threads).items()) == list(one_thread.items()), threads
    for key, value in verify.flatten(state).items():
        if isinstance(value, torch.Tensor):
            assert one_thread[key] == tensor_hash(value, threads=1) == tensor_hash(value, threads=5), key


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("threads", [1, 4])
def test_the_tensors_chunks_hashed_together_go_back_to_their_own_tensor(threads):
    """hash_tensors spreads every tensor's chunks over one pool: an empty tensor between others shifts nothing."""
    tensors = [_bytes(2 * SMALL_CHUNK + 3, seed=2), torch.zeros(0), _bytes(SMALL_CHUNK, seed=3), _bytes(5, seed=4)]
    assert hash_tensors(tensors, threads=threads) == [tensor_hash(t, threads=1) for t in tensors]


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("byte", [0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, 5 * SMALL_CHUNK + 17, 10 * SMALL_CHUNK - 1,
                                  10 * SMALL_CHUNK, 10 * SMALL_CHUNK + 122])
def test_any_flipped_byte_changes_the_hash_the_short_last_chunk_included(byte):
    """10 whole chunks and a last one of 123 bytes: the first and last byte of chunks, a middle one, the tail's."""
    tensor = _bytes(10 * SMALL_CHUNK + 123)
    for threads in (1, 3):
        assert tensor_hash(_flipped(tensor, byte), threads=threads) != tensor_hash(tensor, threads=threads)


@pytest.mark.usefixtures("small_chunks")
def test_a_flipped_byte_of_one_tensor_is_named_alone():
    state = _state()
    saved = digest(state, threads=3)
    state["moments"][0] = _flipped(state["moments"][0], 3 * SMALL_CHUNK + 5)
    assert compare(saved, digest(state, threads=3)) == ["moments[0]: differs"]


@pytest.mark.usefixtures("small_chunks")
def test_the_chunks_order_counts():
    """Two different chunks swapped: the same set of chunk hashes in another order is another tensor."""
    first, second = torch.zeros(SMALL_CHUNK, dtype=torch.uint8), torch.ones(SMALL_CHUNK, dtype=torch.uint8)
    assert tensor_hash(torch.cat([first, second])) != tensor_hash(torch.cat([second, first]))


@pytest.mark.usefixtures("small_chunks")
def test_the_same_bytes_in_another_dtype_or_shape_still_differ():
    data = _bytes(3 * SMALL_CHUNK)
    views = (data, data.view(torch.float32), data.view(torch.bfloat16), data.view(3, SMALL_CHUNK))
    assert len({tensor_hash(view, threads=2) for view in views}) == 4


def test_at_the_real_chunk_size_the_tail_and_the_threads_are_covered():
    """One whole chunk and five bytes (a little over 64 MiB): the tail's last byte and a byte inside the first chunk
    each change the hash, and two threads give the one-thread hash."""
    assert verify.CHUNK_BYTES == 64 * 2**20  # part of every hash: changing it changes every digest
    tensor = _bytes(verify.CHUNK_BYTES + 5)
    whole = tensor_hash(tensor, threads=1)
    assert tensor_hash(tensor, threads=2) == whole
    for byte in (verify.CHUNK_BYTES // 2, verify.CHUNK_BYTES + 4):
        tensor.view(torch.uint8)[byte] ^= 1
        assert tensor_hash(tensor, threads=2) != whole, byte
        tensor.view(torch.uint8)[byte] ^= 1


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("threads", [1, 3])
def test_a_digest_says_what_it_hashed_and_what_that_cost(threads):
    """The proof's spans carry it: every tensor byte, every chunk, the threads, the hashing time; host tensors are
    hashed where they lie, so no copy time."""
    state = _state()
    cost = verify.DigestCost()
    assert digest(state, threads=threads, cost=cost) == digest(state, threads=1)
    tensors = [state["fp32"], *state["moments"], state["bytes"], state["small"]]
    assert cost.tensor_bytes == sum(t.numel() * t.element_size() for t in tensors)
    assert cost.chunks == sum(-(-t.numel() * t.element_size() // SMALL_CHUNK) for t in tensors)
    assert cost.threads == threads and cost.hash_s > 0 and cost.copy_s == 0
    assert cost.fields()["digest_tensor_bytes"] == cost.tensor_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.usefixtures("small_chunks")
def test_a_cuda_tensor_hashes_as_its_host_copy():
    """Each chunk is copied to the host on its own thread: the same hash as the CPU tensor, one thread or many."""
    state = _state()
    on_device = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in state.items()}
    on_device["moments"] = [value.cuda() for value in state["moments"]]
    on_device["transposed"], state["transposed"] = on_device["moments"][0].t(), state["moments"][0].t()
    assert digest(on_device, threads=4) == digest(state, threads=1)
