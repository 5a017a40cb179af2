"""hpc_rl: large-scale self-play reinforcement learning on supercomputers.

Layout (dependencies point one way): ``envs`` know nothing of learning or MPI; ``algo`` is pure maths;
``model`` holds the policy networks; ``transport`` moves bytes between MPI ranks; ``roles`` compose them into
the controller, env, inference and learner ranks; ``storage`` reads and writes runs on disk.
"""

__version__ = "0.1.0"
