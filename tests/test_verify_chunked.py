"""The digest's chunks: a tensor's bytes are hashed CHUNK_BYTES at a time on several threads, and the tensor's hash
is the hash of its header and the chunks' hashes in order. Whatever the thread count, the hash is the same; any
byte, the last chunk's included, and the chunks' order change it.

Most tests shrink CHUNK_BYTES to a few KiB so that small tensors have many chunks; one runs at the real size.
"""

import threading
import time

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


@pytest.mark.usefixtures("small_chunks")
def test_a_cost_that_holds_earlier_figures_gets_this_digests_added():
    """One cost over several digests adds them up: bytes and chunks grow by this digest's, the hashing time by at
    most the wall time on each thread, and host tensors add no copy time to what the cost held."""
    state = _state()
    alone = verify.DigestCost()
    digest(state, threads=3, cost=alone)
    cost = verify.DigestCost(tensor_bytes=10, chunks=2, copy_s=0.5, hash_s=100.0)
    began = time.perf_counter()
    digest(state, threads=3, cost=cost)
    elapsed = time.perf_counter() - began
    assert (cost.tensor_bytes, cost.chunks, cost.threads) == (10 + alone.tensor_bytes, 2 + alone.chunks, 3)
    assert cost.copy_s == 0.5
    assert 100.0 < cost.hash_s <= 100.0 + 3 * elapsed


@pytest.mark.usefixtures("small_chunks")
def test_by_default_every_thread_is_taken_only_above_parallel_bytes(monkeypatch):
    """Without ``threads``: HASH_THREADS threads once the tensors hold more than PARALLEL_BYTES, one up to it."""
    tensors = [_bytes(3 * SMALL_CHUNK), _bytes(SMALL_CHUNK + 1, seed=1)]  # 5 chunks
    total = sum(t.numel() for t in tensors)
    monkeypatch.setattr(verify, "HASH_THREADS", 4)
    for limit, threads in ((total, 1), (total - 1, 4), (0, 4), (10**12, 1)):
        monkeypatch.setattr(verify, "PARALLEL_BYTES", limit)
        cost = verify.DigestCost()
        assert hash_tensors(tensors, cost=cost) == [tensor_hash(t, threads=1) for t in tensors]
        assert cost.threads == threads, limit


def _hashed_on(hash_of, tensor):
    """``hash_of(tensor)``, the tensor made to note the thread that reads each chunk's bytes to hash them
    (``Tensor.numpy``), each read held 5 ms so that reads on several threads overlap: (the hash, the readers' thread
    ids, the most reads at once)."""
    lock, readers, reading = threading.Lock(), [], [0, 0]  # reading: now, most

    class Recording(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is not torch.Tensor.numpy:
                return super().__torch_function__(func, types, args, kwargs or {})
            with lock:
                readers.append(threading.get_ident())
                reading[0] += 1
                reading[1] = max(reading)
            time.sleep(0.005)
            try:
                return super().__torch_function__(func, types, args, kwargs or {})
            finally:
                with lock:
                    reading[0] -= 1

    return hash_of(tensor.as_subclass(Recording)), readers, reading[1]


@pytest.mark.usefixtures("small_chunks")
def test_the_chunks_are_hashed_on_the_threads_asked_for(monkeypatch):
    """``threads`` decides, whatever the default would be: one thread hashes every chunk on the caller's own thread,
    two hash them on a pool of two (never the caller's), no more than two at once."""
    tensor = _bytes(11 * SMALL_CHUNK + 9)  # 12 chunks
    whole = tensor_hash(tensor, threads=1)
    monkeypatch.setattr(verify, "HASH_THREADS", 4)
    monkeypatch.setattr(verify, "PARALLEL_BYTES", 0)  # by default: 4 threads
    hashed, readers, most = _hashed_on(lambda t: tensor_hash(t, threads=1), tensor)
    assert hashed == whole and len(readers) == 12 and set(readers) == {threading.get_ident()} and most == 1
    monkeypatch.setattr(verify, "PARALLEL_BYTES", 10**12)  # by default: 1 thread
    hashed, readers, most = _hashed_on(lambda t: tensor_hash(t, threads=2), tensor)
    assert hashed == whole and len(readers) == 12 and threading.get_ident() not in readers
    assert len(set(readers)) <= 2 and most <= 2


@pytest.mark.usefixtures("small_chunks")
def test_a_host_tensor_is_hashed_where_it_lies():
    """No copy of a contiguous host tensor and no staging buffer (those are for CUDA tensors): hashing it, on one
    thread or several, allocates nothing."""
    tensor = _bytes(5 * SMALL_CHUNK + 3)
    for threads in (1, 3):
        with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as profile:
            tensor_hash(tensor, threads=threads)
        assert [(event.name, event.cpu_memory_usage) for event in profile.function_events
                if event.cpu_memory_usage] == [], threads


def test_a_tensor_whose_bytes_are_not_on_the_host_needs_staging_buffers():
    """Only a CUDA tensor's chunks are copied to the host, into staging buffers; any other tensor off the host (here
    on the meta device, which holds no bytes at all) meets the same guard rather than being hashed as if it had."""
    with pytest.raises(AssertionError, match=r"^a CUDA tensor's digest needs its staging buffers$"):
        tensor_hash(torch.empty(4, device="meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.usefixtures("small_chunks")
def test_a_cuda_tensor_hashes_as_its_host_copy():
    """Each chunk is copied to the host on its own thread: the same hash as the CPU tensor, one thread or many; the
    copies' time is recorded apart from the hashing's."""
    state = _state()
    on_device = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in state.items()}
    on_device["moments"] = [value.cuda() for value in state["moments"]]
    on_device["transposed"], state["transposed"] = on_device["moments"][0].t(), state["moments"][0].t()
    cost = verify.DigestCost()
    assert digest(on_device, threads=4, cost=cost) == digest(state, threads=1)
    assert cost.copy_s > 0 and cost.hash_s > 0
