"""Learning placers: a policy proposes placements, the simulator scores them, REINFORCE improves the policy.

The pieces every learner shares live here once:

- ``features``: placement units (groups of ops that move whole) and their feature vectors;
- ``env``: placements of units in, a batch of step times / peak memories / out-of-memory flags out,
  and the papers' reward (minus the square root of the step time, a failing signal when a
  placement does not fit);
- ``rollouts``: the batch evaluated in this process, in local worker processes or on Ray; the
  learner samples, so a seed gives the same run whatever evaluates it;
- ``options``: the run-control options of every learner (budget, rollouts, checkpoint, log);
- ``train`` (torch): the REINFORCE loop with its baseline, learning-rate schedule, checkpoints,
  resume, training log and progress;
- ``nets`` (torch): the sequence-to-sequence placer with attention and the Hierarchical Planner's
  Grouper;
- ``encoder``, ``marsnet``, ``ppo`` (torch, PyTorch Geometric): Mars's pre-trained GCN encoder, its
  segment-level placer and its PPO update.

Each learner is one module registered as a placer (``colocrl``, ``hp``, ``mars``); it imports torch only
when it runs, so ``import devplace`` and the algorithmic placers stay torch-free.
"""

from devplace.learn import colocrl, hp, mars, placeto  # noqa: F401,E402  (register the learners; torch-free until they run)
