"""The proof's iteration K+1 on CUDA runs with deterministic kernels; everything else as a user's would.

Flash attention's backward on CUDA accumulates with atomics unless torch's deterministic mode is on and not
warn-only, so the resumed iteration K+1 and the uninterrupted run's may differ in their last bits: the proof then
compares two deterministic runs of the same iteration. These tests hold the switch itself (on only when asked,
the previous setting restored, the cuBLAS workspace set once on CUDA, never over a user's), and, where a GPU is
present, that a flash-attention backward run twice under it gives the same bits.
"""

import os

import pytest
import torch
import torch.nn.functional as F

from restartbench.runtime import CUBLAS_PROOF_WORKSPACE, prepare_deterministic_proof, proof_kernels


@pytest.fixture(autouse=True)
def _restore_torch_setting():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_deterministic_kernels_only_inside_the_block_when_asked():
    torch.use_deterministic_algorithms(False)
    with proof_kernels(False):
        assert not torch.are_deterministic_algorithms_enabled()
    with proof_kernels(True):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()  # warn-only keeps flash non-deterministic
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_users_own_setting_is_given_back_even_after_an_error():
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.raises(ValueError), proof_kernels(True):
        raise ValueError("iteration failed")
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()


def test_the_cublas_workspace_is_set_on_cuda_only_and_never_over_the_users(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert prepare_deterministic_proof("cpu") is None
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    note = prepare_deterministic_proof("cuda")
    assert note and CUBLAS_PROOF_WORKSPACE in note
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_PROOF_WORKSPACE
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert prepare_deterministic_proof("cuda") is None
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flash_attention_backward_twice_gives_the_same_bits_under_the_proof_kernels():
    """The study's attention (causal SDPA in bf16) at a long sequence, backward twice on the same inputs."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_PROOF_WORKSPACE)
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4096, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3))

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*leaves, is_causal=True).float().square().sum().backward()
        return [leaf.grad for leaf in leaves]

    with proof_kernels(True):
        first, second = grads(), grads()
    assert all(torch.equal(a, b) for a, b in zip(first, second))
