"""Where each rollout row's randomness comes from and how rows travel within a step: the glue between TRL's hooks
in `StableDRLTrainer`, kept apart from the hooks themselves.

`RolloutRows` is a mixin of the trainer that overrides nothing of TRL's (a test checks this). It reads the
trainer's `args`, `state`, `accelerator`, `num_generations`, `num_iterations`, `_step`, `_scoring` and
`processing_class`:

- the stream ids mixed into the per-row seeds (`_STREAM_*`), so each use of the estimator and the sampler draws its
  own randomness, and `_generator` (a torch.Generator per stream, replayed exactly on resume);
- the row keys: `_rollout_row_keys` (a row's position in the run's global stream of rollouts) and `_row_keys` (the
  keys of the rows being scored, from `ScoringContext.mask_rows`);
- `_shuffle_groups` (whole groups of `num_generations` rows permuted, for the group-normalised objectives);
- `_inner_iteration` and `_aligned` (which inner iteration a micro-step is in; whether generation and optimisation
  are aligned, so the old policy is the current one);
- `_canvas_completions` (`reward_text="canvas"`: the completions replaced by their rows' decoded canvases).
"""

from __future__ import annotations

import torch

from .diffusion.seeding import mix_seed, rollout_row_keys

# Stream ids mixed into the per-row mask seeds, so that each use of the estimator draws its own masks.
_STREAM_OLD, _STREAM_ITER, _STREAM_STEP, _STREAM_SAMPLER, _STREAM_ROWS = 1, 2, 3, 4, 5


class RolloutRows:
    """The per-row randomness and batch glue of `StableDRLTrainer`'s hooks, as a mixin (see the module docstring)."""

    def _generator(self, *stream: int) -> torch.Generator:
        """A generator seeded from the config seed, the process and a stream: rollouts replay exactly on resume."""
        value = int(
            mix_seed(torch.zeros(1, dtype=torch.long), self.args.seed, self.accelerator.process_index, *stream)
        )
        return torch.Generator(device=self.accelerator.device).manual_seed(value)

    def _rollout_row_keys(self, num_rows: int) -> torch.Tensor:
        """Keys (num_rows,) of this process's rows of the generation batch being made: their positions in the run's
        global stream of rollouts (TRL's sampler order; process p holds the p-th slice of each generation batch),
        so each row draws its own masks and keeps them under any layout of processes and micro-batches."""
        ga = self.args.gradient_accumulation_steps
        generate_every = self.args.steps_per_generation * self.num_iterations
        # micro-steps since the start of the run (restored exactly on resume, unlike TRL's micro-step counter)
        micro_steps = self.state.global_step * ga + self._step % ga
        generation = micro_steps // generate_every
        first = (generation * self.accelerator.num_processes + self.accelerator.process_index) * num_rows
        mode = 0 if self.model.training else 1  # evaluation rollouts form their own stream
        return rollout_row_keys(first, num_rows, _STREAM_ROWS, mode, device=self.accelerator.device)

    def _row_keys(self, num_rows: int, device) -> torch.Tensor:
        """Keys of the rows being scored: `ScoringContext.mask_rows` (set from the batch), else the rows' indices in
        the call."""
        keys = self._scoring.mask_rows
        if keys is None:
            return torch.arange(num_rows, device=device)
        if keys.shape != (num_rows,):
            raise RuntimeError(
                f"mask row keys of shape {tuple(keys.shape)} for {num_rows} rows being scored: the batch's "
                "'mask_row_key' must hold one key per row."
            )
        return keys.to(device)

    def _shuffle_groups(self, batch: dict) -> dict:
        """Permute whole groups of num_generations consecutive rows (TRL permutes rows, which splits groups)."""
        n = len(next(v for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim > 0))
        g = self.num_generations
        if n % g != 0:
            raise ValueError(f"local generation batch of {n} rows is not a multiple of num_generations={g}.")
        perm_groups = torch.randperm(n // g, generator=self._generator(_STREAM_STEP, -1, self.state.global_step))
        perm = (perm_groups[:, None] * g + torch.arange(g)[None, :]).reshape(-1)  # (n,)

        def permute(v):
            if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == n:
                return v[perm.to(v.device)]
            if isinstance(v, list) and len(v) == n:
                return [v[i] for i in perm.tolist()]
            return v

        return {k: permute(v) for k, v in batch.items()}

    @property
    def _inner_iteration(self) -> int:
        return (self._step // self.args.steps_per_generation) % self.num_iterations

    @property
    def _aligned(self) -> bool:
        return self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations) == 0

    def _canvas_completions(self, completions: list) -> list:
        """`completions` with each text replaced by its row's decoded canvas (special tokens skipped), in the
        structure TRL builds: a string, or one assistant message for conversational prompts."""
        canvases, self._scoring.canvas_ids = self._scoring.canvas_ids, None
        if canvases is None or len(canvases) != len(completions):
            raise RuntimeError(
                f"reward_text='canvas': expected the rollout canvases of the {len(completions)} completions being "
                f"scored, found {'none' if canvases is None else len(canvases)}."
            )
        texts = self.processing_class.batch_decode(canvases, skip_special_tokens=True)
        return [
            text if isinstance(c, str) else [{"role": "assistant", "content": text}]
            for c, text in zip(completions, texts, strict=True)
        ]
