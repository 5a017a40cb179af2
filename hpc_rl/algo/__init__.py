"""The learning maths as pure functions of tensors: advantages, losses, gradient clipping, normalisation, rewards.

Nothing here knows of MPI. Where several learners must agree (advantage statistics, gradient averages, normaliser
statistics), a function takes a ``reduce`` callable (``reduce.py``) that sums a tensor over the learners; the default (identity) is
the single-process case, and a distributed learner passes its allreduce.
"""
