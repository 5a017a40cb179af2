"""The PPO learner: ``update(batch) -> metrics``, one policy version per call, as a learner rank runs it."""

from __future__ import annotations

import time

import numpy as np
import torch

from hpc_rl import metric_names as M
from hpc_rl.algo.bptt import to_chunks
from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.gae import gae
from hpc_rl.algo.grad_clip import SecondMomentClip
from hpc_rl.algo.normalizer import RunningNormalizer
from hpc_rl.algo.ppo import (dual_clip_policy_loss, entropy_bonus, kickstart_loss, normalize_advantages,
                             value_loss)
from hpc_rl.algo.reduce import Reduce, identity_reduce
from hpc_rl.model.policy import Policy
from hpc_rl.model.tree import to_numpy_tree, to_torch_tree
from hpc_rl.data.batch import Batch
from hpc_rl.envs.api import TRUNCATED
from hpc_rl.envs.teacher import TEACHER_HEADS, teacher_info


class Learner:
    """PPO on batches of segments: ``update(batch) -> metrics``, one policy version per call.

    With several learners in lockstep, ``allreduce_sum`` sums a tensor over them (identity for one) and
    ``world_size`` is their number: gradients are averaged before OpenAI Five's clip, advantages are normalised by
    the global batch's statistics and the observation normaliser folds in every learner's batch, so all learners
    hold identical parameters after every step.
    """

    def __init__(self, policy: Policy, config: PPOConfig, allreduce_sum: Reduce = identity_reduce,
                 world_size: int = 1, device: torch.device | str = "cpu", seed: int = 0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.policy, self.config = policy, config
        self.allreduce_sum, self.world_size = allreduce_sum, world_size
        self.device = torch.device(device)
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr(0), eps=config.adam_eps,
                                          fused=True)
        mean = None if world_size == 1 else (lambda g: allreduce_sum(g) / world_size)
        self.clip = SecondMomentClip(policy.parameters(), beta=config.clip_beta, k=config.clip_k, allreduce_mean=mean)
        widths = {"global": policy.spec.global_features, **{f"entities/{e.name}": e.num_features
                                                            for e in policy.spec.entities}}
        self.normalizers = {key: RunningNormalizer(widths[key]) for key in policy.norm_keys}
        self.value_normalizer = RunningNormalizer(1) if config.value_norm else None
        self.version = 0
        self.generator = torch.Generator().manual_seed(seed)

    def update(self, batch: Batch) -> dict[str, float]:
        cfg = self.config
        started = time.perf_counter()
        truncated = batch.fields.get(f"info/{TRUNCATED}") if cfg.time_limit_bootstrap else None
        advantages, returns = gae(batch.reward, batch.value, batch.done.float(), batch.bootstrap_value,
                                  cfg.gamma(self.version), cfg.lam, truncated)
        if cfg.normalize_advantages:
            advantages = normalize_advantages(advantages, batch.weight, self.allreduce_sum)
        if self.value_normalizer is not None:
            # The targets of this update join the statistics first, so the head is never asked for a value far
            # outside the units it predicts in (the advantages above used the behaviour values, in reward units).
            self._update_value_normalizer(returns, batch.weight)

        chunk_len = self.policy.config.chunk_len
        chunked = {
            "adv": to_chunks(advantages, chunk_len), "ret": to_chunks(returns, chunk_len),
            "logp": to_chunks(batch.logp, chunk_len), "value": to_chunks(batch.value, chunk_len),
            "weight": to_chunks(batch.weight, chunk_len), "hero": to_chunks(batch.hero, chunk_len),
            "starts": to_chunks(batch.starts, chunk_len),
        }
        chunked = {k: v.to(self.device) for k, v in chunked.items()}
        obs = {k: to_chunks(v, chunk_len).to(self.device) for k, v in batch.obs.items()}
        actions = {k: to_chunks(v, chunk_len).to(self.device) for k, v in batch.actions.items()}
        kickstart_coef = cfg.kickstart_coef(self.version)
        teacher = None
        if kickstart_coef > 0:
            teacher = {head: to_chunks(batch[f"info/{teacher_info(head)}"], chunk_len).to(self.device)
                       for head in TEACHER_HEADS}
        h0 = batch.chunk_h.reshape(-1, batch.chunk_h.shape[-1]).to(self.device)
        c0 = batch.chunk_c.reshape(-1, batch.chunk_c.shape[-1]).to(self.device)
        columns = h0.shape[0]
        if columns < cfg.num_minibatches:
            raise ValueError(f"{columns} BPTT chunks cannot fill {cfg.num_minibatches} minibatches")

        lr = cfg.learning_rate(self.version)
        entropy_coef = cfg.entropy_coef(self.version)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums = dict.fromkeys((M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.APPROX_KL, M.CLIP_FRACTION,
                              M.GRAD_CLIPPED_FRACTION, M.KICKSTART_LOSS), 0.0)
        steps = skipped = 0
        mixed_precision = cfg.precision == "bfloat16"
        for _ in range(cfg.epochs):
            order = torch.randperm(columns, generator=self.generator).to(self.device)
            for idx in order.chunk(cfg.num_minibatches):
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=mixed_precision):
                    out = self.policy({k: v[:, idx] for k, v in obs.items()}, chunked["hero"][:, idx],
                                      chunked["starts"][:, idx], (h0[idx], c0[idx]),
                                      actions={k: v[:, idx] for k, v in actions.items()},
                                      teacher=None if teacher is None else {k: v[:, idx] for k, v in teacher.items()})
                # The losses in float32 (a no-op without mixed precision): the ratio exp(logp − logp_old) and the
                # advantage-weighted sums lose too much in bf16's 8 bits of mantissa.
                w = chunked["weight"][:, idx]
                pl, stats = dual_clip_policy_loss(out.logp.float(), chunked["logp"][:, idx], chunked["adv"][:, idx],
                                                  cfg.clip_eps, cfg.dual_clip, w)
                scale = self.policy.normalized_value
                vl = value_loss(scale(out.value.float()), scale(chunked["value"][:, idx]),
                                scale(chunked["ret"][:, idx]), cfg.value_clip, w)
                ent = entropy_bonus(out.entropy.float(), w)
                loss = pl + cfg.value_coef * vl - entropy_coef * ent
                ks = torch.zeros(())
                if teacher is not None:
                    ks = kickstart_loss(out.teacher_logp.float(), w)
                    loss = loss + kickstart_coef * ks
                self.optimizer.zero_grad(set_to_none=False)
                loss.backward()
                # Every learner must take the same decision, so the non-finite test is on the summed flag.
                finite = self.allreduce_sum(torch.tensor([0.0 if torch.isfinite(loss) else 1.0]))
                if finite.item() > 0:
                    skipped += 1
                    continue
                clipped = self.clip()
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                steps += 1
                for key, value in ((M.POLICY_LOSS, pl), (M.VALUE_LOSS, vl), (M.ENTROPY, ent),
                                   (M.APPROX_KL, stats["approx_kl"]), (M.CLIP_FRACTION, stats["clip_fraction"]),
                                   (M.KICKSTART_LOSS, ks)):
                    sums[key] += float(value.detach())
                sums[M.GRAD_CLIPPED_FRACTION] += clipped
        self.version += 1
        self._update_normalizers(batch)

        metrics = {name: sums[name] / max(steps, 1) for name in sums}
        w = batch.weight > 0
        residual = (returns - batch.value)[w]
        metrics.update({
            M.LR: lr, M.ENTROPY_COEF: entropy_coef, M.KICKSTART_COEF: kickstart_coef,
            M.NONFINITE_SKIPPED: float(skipped),
            M.EXPLAINED_VARIANCE: float(1.0 - residual.var() / returns[w].var().clamp_min(1e-8)),
            M.TRAIN_STALENESS: float((self.version - 1 - batch.version.float())[w].mean()),
            M.UPDATE_SECONDS: time.perf_counter() - started, M.SAMPLES: float(batch.num_samples),
        })
        return metrics

    def _update_normalizers(self, batch: Batch) -> None:
        """Fold the batch's trained observations into the normaliser and ship it inside the policy."""
        trained = batch.weight.numpy() > 0
        for key, normalizer in self.normalizers.items():
            x = batch.obs[key].numpy()
            rows = x[trained] if key == "global" else x[trained][batch.obs[f"{key}/mask"].numpy()[trained]]
            normalizer.update(rows, self.allreduce_sum)
            mean, std = normalizer.mean_std()
            self.policy.set_normalizer(key, torch.from_numpy(mean), torch.from_numpy(std))

    def _update_value_normalizer(self, returns: torch.Tensor, weight: torch.Tensor) -> None:
        """Fold the trained samples' returns into the running statistics and ship them inside the policy. Non-finite
        returns (a corrupt batch, whose update is skipped) leave the statistics alone on every learner: one NaN would
        otherwise make every later value non-finite."""
        trained = returns[weight > 0]
        if self.allreduce_sum(torch.tensor([0.0 if torch.isfinite(trained).all() else 1.0])).item() > 0:
            return
        self.value_normalizer.update(trained.reshape(-1, 1).double().numpy(), self.allreduce_sum)
        mean, std = self.value_normalizer.mean_std()
        self.policy.set_value_normalizer(float(mean[0]), float(std[0]))

    def state_dict(self) -> dict:
        """Everything a resumed learner needs to continue exactly: parameters, optimiser and clip moments, version,
        normaliser statistics and the minibatch shuffling generator."""
        normalizers = {k: n.state_dict() for k, n in self.normalizers.items()}
        if self.value_normalizer is not None:
            normalizers["value"] = self.value_normalizer.state_dict()
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "clip": self.clip.state_dict(), "version": self.version, "normalizers": normalizers,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the state holds the eps it was saved with; a resume may change it
            group["eps"] = self.config.adam_eps
        self.clip.load_state_dict(state["clip"])
        self.version = int(state["version"])
        for key, normalizer in self.normalizers.items():
            normalizer.load_state_dict(state["normalizers"][key])
        if self.value_normalizer is not None:
            self.value_normalizer.load_state_dict(state["normalizers"]["value"])
        self.generator.set_state(state["generator"])

    def checkpoint_sections(self) -> dict:
        """The state as the checkpoint file's sections (numpy trees): what ``hpc_rl.storage`` commits."""
        state = self.state_dict()
        return {"params": to_numpy_tree(state["policy"]), "optimizer": to_numpy_tree(state["optimizer"]),
                "clip": to_numpy_tree(state["clip"]), "normalizers": to_numpy_tree(state["normalizers"]),
                "learner": {"version": self.version, "rng": state["generator"].numpy()}}

    def load_checkpoint_sections(self, sections: dict) -> None:
        self.load_state_dict({"policy": to_torch_tree(sections["params"]),
                              "optimizer": to_torch_tree(sections["optimizer"]),
                              "clip": to_torch_tree(sections["clip"]),
                              "normalizers": sections["normalizers"],
                              "version": sections["learner"]["version"],
                              "generator": torch.from_numpy(np.array(sections["learner"]["rng"]))})
