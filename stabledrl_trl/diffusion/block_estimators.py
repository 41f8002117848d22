"""One-pass ("staircase") likelihood estimates for block-diffusion LMs (SDAR, TraDo).

A block-diffusion LM factorises a sequence into blocks of `block_size` tokens, each denoised given the clean blocks
before it. Its ELBO is the sum over blocks of a masked-diffusion ELBO term for the block given the clean history
(BD3-LM, arXiv 2503.09573, Eq. 3):

    log p(y | x)  >=  sum_b  E_t [ (1/t) sum_{i in block b, masked} log p(y_i | y_{<b} clean, block b noisy) ].

Computing the terms block by block costs one forward per block. The 2n ("staircase") layout gets all of them in one
forward: the row [x_t || x_0] (a noisy copy of prompt + completion, then the clean copy, both with the positions of
one copy) is run with the mask of `stabledrl_trl.models.sdar.two_copy_block_mask`: a noisy query sees the noisy keys
of its own block and the clean keys of strictly earlier blocks, a clean query the clean keys of its own and earlier
blocks. The noisy copy's logits at block b are then exactly the block's denoising predictions given the clean history.

Masks and weights are those of the full-attention estimators (`stabledrl_trl.diffusion.masking` /
`stabledrl_trl.diffusion.estimators`), drawn over the completion with the same counter-based, per-row seeds, so every
estimator name keeps its meaning and the returned `LikelihoodEstimate` has the same fields:
- "mc_elbo" (per-token mean, the official StableDRL form) and "mc_elbo_inv_t" (1/t form: SDAR's training loss, one t
  per sample, sum over masked tokens of log p / t divided by the answer length); K samples, chunked, fresh or shared
  seeds;
- "mean_field": every completion token masked: each block predicted from the clean history alone;
- "block_random", "block_random_coupled", "coupled": SPG's (also in complementary pairs) and DiffuCoder's masks,
  scored the same way;
- "sdmc", "sdmc_coupled": Gauss-Legendre times over the whole completion, count-weighted, scored the same way.
Real prompt tokens are masked in the noisy copy with probability `p_mask_prompt` (this reaches the prediction only
through the prompt's tail, which shares the first completion block); the clean copy is never masked.
Cost: one forward of length 2(P + C) per sample, instead of one per block.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from stabledrl_trl.models.bidirectional import padding_position_ids
from stabledrl_trl.models.sdar import two_copy_block_mask

from .estimators import ESTIMATOR_SPECS, LikelihoodEstimate, estimate_likelihood


class StaircaseLogits:
    """`logits_fn` for the estimators: rows [masked copy || clean copy] (N, 2L) -> the masked copy's logits (N, L, V).

    `two_copy = True` tells `estimators._estimate` to append the clean copy. The attention mask (N, 2L) holds the
    same 2-D padding mask twice; positions count the real tokens of one copy; the 4-D mask is
    `two_copy_block_mask`. Only the masked copy goes through the output head (`logits_to_keep`): the clean copy is
    context, and its logits would double the largest activation ((N, 2L, V) with V ~ 150k for SDAR). `model` is an
    SDAR-like transformers model (possibly PEFT / DDP wrapped) taking a 4-D boolean attention mask, position ids and
    `logits_to_keep`.
    """

    two_copy = True

    def __init__(self, model: nn.Module, block_size: int):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int (the model's config.block_size), got {block_size!r}")
        self.model = model
        self.block_size = block_size

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        n, two_l = input_ids.shape
        if two_l % 2:
            raise ValueError(f"two-copy rows must have an even length, got {two_l}")
        L = two_l // 2
        real = attention_mask[:, :L].bool()  # (n, L)
        positions = padding_position_ids(real)  # (n, L)
        mask = two_copy_block_mask(positions, real, self.block_size)  # (n, 1, 2L, 2L)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=torch.cat([positions, positions], 1),
            logits_to_keep=torch.arange(L, device=input_ids.device),  # the masked copy only
        )
        return out.logits if hasattr(out, "logits") else out[0]  # (n, L, V)


def staircase_estimate(
    name: str,
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    block_size: int,
    mask_token_id: int,
    seed,
    num_samples: int | None = None,
    p_mask_prompt: float | None = None,
    chunk_size: int | None = None,
    eubo_beta: float | None = None,
    context_mask: Tensor | None = None,
    estimator_block_size: int | None = None,
    **estimator_kwargs,
) -> LikelihoodEstimate:
    """Block-diffusion likelihood estimate `name` (see `estimators.ESTIMATORS`) with every block scored in one pass.

    prompt_ids (B, P) left-padded with prompt_mask; completion_ids (B, C) right-padded with completion_mask (1 up to and
    including the first EOS). block_size: the model's diffusion block (config.block_size); blocks are aligned on the
    real-token positions of prompt + completion, as at generation. `seed`: int, torch.Generator or (B,) per-row seeds.
    estimator_block_size: the block of "block_random" / "block_random_coupled" masks (SPG's, independent of the model's
    block_size). Estimator options (e.g. `nodes` for sdmc) go through `estimator_kwargs`.
    Other arguments as `estimators.estimate_likelihood` (chunk_size counts two-copy rows, each 2(P + C) long).
    Returns a `LikelihoodEstimate` (token_logps (B, C), seq_logps (B,), token_entropy (B, C), eubo).
    """
    if estimator_block_size is not None:
        spec = ESTIMATOR_SPECS.get(name)
        if spec is None or "block_size" not in spec.options:  # the estimators declaring a block_size option
            raise ValueError(f"estimator_block_size is an option of 'block_random' masks, not of {name!r}")
        estimator_kwargs["block_size"] = estimator_block_size
    return estimate_likelihood(
        name,
        StaircaseLogits(model, block_size),
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        mask_token_id=mask_token_id,
        seed=seed,
        num_samples=num_samples,
        p_mask_prompt=p_mask_prompt,
        chunk_size=chunk_size,
        eubo_beta=eubo_beta,
        context_mask=context_mask,
        **estimator_kwargs,
    )
