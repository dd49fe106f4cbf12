"""The language-model head and cross-entropy over chunks of tokens: the full logits never exist.

At GPT-2's vocabulary (50,304) the logits of B*T tokens are the largest tensor of a step:
B*T*V values in the compute dtype, an fp32 copy for the softmax, and the gradient of the same
shape in backward. `perf.loss=chunked` computes them `chunk` tokens at a time instead:

    for each chunk c of the N = B*T tokens:
        z_c   = x_c @ W^T                        (chunk x V logits, the autocast dtype)
        loss += sum(logsumexp(z_c) - z_c[target])            (in fp32)
        g_c   = softmax(z_c) - onehot(target)            n_valid * d(mean loss)/d z_c
        dx_c  = g_c @ W / n_valid ;  dW += g_c^T @ x_c    (the head's backward, done now)
    dW /= n_valid                                         (in fp32, after the 16-bit matmuls)

The gradient is taken in the forward, chunk by chunk, while z_c is at hand (the scheme of
Liger-Kernel's fused linear cross-entropy, written here in plain PyTorch): backward then only
scales dx and dW by the incoming gradient, so no chunk's logits are ever computed twice and the
matmul FLOPs are the same as the full head's (2NVC forward, 4NVC backward). What stays whole is
dx (N x C) and dW (V x C, as big as the weight); the largest transient is one chunk's logits.

Targets equal to -1 are ignored (nanoGPT's ignore_index); the loss is the mean over the rest,
as F.cross_entropy's. Runs on any device; with torch.compile, Dynamo traces the Function.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -1


def compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the head's matmuls run in: autocast's when it is on (the full head's logits are
    in it too), else the input's.

    Written for Dynamo on every supported torch: `torch.is_autocast_enabled(device_type)` is
    folded to a constant by torch 2.11's Dynamo as by 2.13's, while
    `torch.amp.is_autocast_available` (`torch._C._is_autocast_available`) has no trace rule in
    2.11 and broke the compiled chunked loss's graph 3 times (the 2026-11-28 H200 loan). The meta
    device, where FLOPs are counted, has no autocast and would raise: it is asked first."""
    if device_type != "meta" and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk: int, dtype: torch.dtype):
        n_valid = (targets != IGNORE_INDEX).sum().clamp(min=1)
        want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.weight_dtype = weight.dtype  # its gradient must match the parameter
        w = weight.to(dtype)
        loss = torch.zeros((), device=x.device, dtype=torch.float32)
        dx = torch.empty_like(x) if want_dx else None
        dw = torch.zeros_like(weight, dtype=torch.float32) if want_dw else None
        for start in range(0, x.shape[0], chunk):
            x_c = x[start : start + chunk].to(dtype)
            t_c = targets[start : start + chunk]
            valid = t_c != IGNORE_INDEX
            safe = t_c.clamp(min=0)  # an ignored position gathers index 0 and is masked out
            z = (x_c @ w.t()).float()  # the chunk's logits, upcast for the softmax
            lse = torch.logsumexp(z, dim=-1)
            picked = z.gather(1, safe[:, None]).squeeze(1)
            loss += ((lse - picked) * valid).sum()
            if want_dx or want_dw:
                # d loss / d z = softmax(z) - onehot(target), for valid rows; in place over z.
                # The 1/n_valid of the mean is applied after the matmuls, in fp32: divided
                # first, the entries (about 1/(V * n_valid)) would round to zero in fp16 before
                # the loss scale arrives in backward. Undivided they lie in [-1, 1], and each
                # row of g sums to 0, so g @ W and g^T @ x stay far inside fp16's range.
                z.sub_(lse[:, None]).exp_()
                z.scatter_add_(1, safe[:, None], -valid[:, None].to(z.dtype))
                z.mul_(valid[:, None])
                g, z = z.to(dtype), None  # the 16-bit gradient; the fp32 buffer is freed here
                if want_dx:
                    dx[start : start + chunk] = ((g @ w).float() / n_valid).to(x.dtype)
                if want_dw:
                    dw.add_(g.t() @ x_c)
            # Let go of this chunk's logits before the next chunk's exist: a name still bound
            # keeps its tensor until the next iteration rebinds it, and the peak would then be
            # two chunks (this one's fp32 z and 16-bit g beside the next one's).
            z = g = None
        if dw is not None:
            dw.div_(n_valid)
        ctx.save_for_backward(dx, dw)
        return loss / n_valid

    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw = ctx.saved_tensors
        grad_x = dx * grad_loss.to(dx.dtype) if dx is not None else None
        grad_w = None
        if dw is not None:
            grad_w = (dw * grad_loss).to(ctx.weight_dtype)
        return grad_x, grad_w, None, None, None


def chunked_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight.T` against `targets`, `chunk` tokens at a time.

    x: (N, C) hidden states after the final LayerNorm; weight: (V, C) the head's; targets: (N,).
    """
    dtype = compute_dtype(x.device.type, x.dtype)
    return ChunkedLinearCrossEntropy.apply(x, weight, targets, chunk, dtype)
