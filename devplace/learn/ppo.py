"""Proximal Policy Optimization (torch): Mars's update, one batch of placements at a time.

Mars trains its placer by PPO (Schulman et al., 2017) instead of REINFORCE, to learn more from each
sample. A placement is one episode of U decisions (a device per unit) with one reward at the end
(minus the square root of the step time, as the other learners). With no discount (an early
decision matters as much as a late one) each decision's return is that reward and its advantage
the reward minus the value the critic predicted at that decision, computed once from the sampling
pass, as CleanRL's PPO computes them before its epochs. Then ``update_epochs`` passes over the
batch, each in ``minibatches`` shuffled minibatches of placements, minimise

    -min(r A, clip(r, 1 - eps, 1 + eps) A)  +  value_coef * value loss  -  entropy_coef * entropy

with r the ratio of the new to the old probability of each decision, A normalised per minibatch,
and the value loss clipped around the old values (CleanRL's ``clip_vloss``); the gradient's norm is
clipped to ``grad_clip``. The clipped term has no gradient once a ratio has left the clip range in
the advantage's direction, so one batch cannot push the policy far from the one that sampled it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PPOSettings:
    clip: float
    update_epochs: int
    minibatches: int
    entropy_coef: float
    value_coef: float
    grad_clip: float


@dataclass
class Batch:
    """A sampled batch: per placement and decision (K, U) the action, its old log-probability and the
    old value; per placement (K,) the reward."""

    actions: torch.Tensor
    old_log_prob: torch.Tensor
    old_value: torch.Tensor
    reward: torch.Tensor


def ppo_update(evaluate, parameters, optimizer: torch.optim.Optimizer, batch: Batch, settings: PPOSettings,
               generator: torch.Generator) -> dict:
    """``update_epochs`` x ``minibatches`` gradient steps on ``batch``; ``evaluate(actions)`` gives the
    current policy's ``Decisions`` of those actions. Returns the last minibatch's loss, the mean
    entropy and the fraction of decisions whose ratio was clipped."""
    parameters = list(parameters)
    k = batch.actions.shape[0]
    returns = batch.reward.unsqueeze(1).expand_as(batch.old_value)
    advantage = returns - batch.old_value
    figures = {"loss": 0.0, "entropy": 0.0, "clipped": 0.0}
    for _ in range(settings.update_epochs):
        order = torch.randperm(k, generator=generator)
        for rows in np.array_split(order.numpy(), min(settings.minibatches, k)):
            rows = torch.from_numpy(rows)
            now = evaluate(batch.actions[rows])
            ratio = torch.exp(now.log_prob - batch.old_log_prob[rows])
            adv = advantage[rows]
            if adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - settings.clip, 1 + settings.clip)).mean()
            old_v = batch.old_value[rows]
            v_clipped = old_v + torch.clamp(now.value - old_v, -settings.clip, settings.clip)
            value_loss = 0.5 * torch.max((now.value - returns[rows]) ** 2, (v_clipped - returns[rows]) ** 2).mean()
            entropy = now.entropy.mean()
            loss = policy_loss + settings.value_coef * value_loss - settings.entropy_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
            optimizer.step()
            figures = {"loss": float(loss.detach()), "entropy": float(entropy.detach()),
                       "clipped": float(((ratio - 1).abs() > settings.clip).float().mean())}
    return figures
