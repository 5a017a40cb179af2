"""One training run as one MPI job: assign roles, build the channels, run each role, shut down in order.

    run(config)   # every rank of the job calls this; the topology says what each rank does

Start-up (collective): check the world size against the topology, resolve the run directory and the checkpoint to
resume from (controller), connect every rank's lifeline to the controller, probe the transport, create the channels
(every learner's ring, the parameter channel, the step exchange). Shut-down: every rank enters a non-blocking
barrier once it has stopped producing; learners keep draining their rings until every rank is there, so no writer
stays blocked on a full ring; then the channels are closed in the same order everywhere, and the lifelines last.
Last, the controller plays the final evaluation and prints and writes the summary (``Controller.conclude``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from pathlib import Path

from mpi4py import MPI

from hpc_rl.config import ResumeError, TrainConfig
from hpc_rl.failures import EXIT_REFUSED
from hpc_rl.launch import set_torch_threads
from hpc_rl.populations import learner_population, population_sections
from hpc_rl.roles.allreduce import MpiAllreduce, make_allreduce
from hpc_rl.roles.common import Backoff, StopFlag, open_channels, setup_logging
from hpc_rl.roles.control import ControlLink, MpiControl
from hpc_rl.roles.env_worker import EnvWorker
from hpc_rl.roles.lifeline import Lifelines, hold_lifeline, say_last_words
from hpc_rl.roles.protocol import CONTROLLER, TAG_ACCOUNTING, TAG_RESUME
from hpc_rl.slurm import RequeueError
from hpc_rl.storage import write_meta
from hpc_rl.storage.runlock import RunLockedError, acquire_run_lock
from hpc_rl.topology import (PlacementError, Role, Topology, WorldSizeError, check_components, gpu_slots,
                             het_components)
from hpc_rl.transport import Transport


def run(config: TrainConfig, comm: MPI.Comm = MPI.COMM_WORLD, overrides: tuple[str, ...] = ()) -> int | None:
    """Run the whole job; returns the final version on the controller, None elsewhere.

    ``overrides`` (the command line's config overrides) go into ``<runs_dir>/index.tsv`` beside the run's name, so
    a sweep directory lists which member ran what.

    A rank that raises aborts the whole job. ``python -m mpi4py`` does that for a script, but a Hydra sweep member
    runs inside submitit, which catches the exception, records it and exits normally: the other ranks would then
    wait for this one forever (and this one, in MPI_Finalize, for them).
    """
    try:
        return _run(config, comm, overrides)
    except (RequeueError, RunLockedError, ResumeError, WorldSizeError, PlacementError) as err:
        # Raised where no rank is inside MPI: a refused requeue once every rank has finished, the refusal of the run
        # lock or of the resume, broadcast to every rank before any wrote the run's state, or a world size or a
        # heterogeneous job's components that every rank finds wrong alike. Finish MPI and end the job non-zero
        # (Slurm records a failure) without MPI_Abort, whose banner would bury the reason; the controller alone says
        # why, and alone ends non-zero: under `srun --kill-on-bad-exit` the first rank to end non-zero gets the others
        # killed, and ranks on other nodes, leaving MPI_Finalize before the controller printed, had it killed
        # unheard. The status tells the batch script that the same job would be refused again: it is not requeued
        # as a failure (hpc_rl/failures.py).
        controller = comm.Get_rank() == CONTROLLER
        if controller:
            print(f"hpc_rl: {err}", file=sys.stderr, flush=True)
        logging.shutdown()
        MPI.Finalize()
        os._exit(EXIT_REFUSED if controller else 0)
    except BaseException as err:
        traceback.print_exc()
        sys.stderr.flush()
        say_last_words(f"{type(err).__name__}: {err}")  # the controller names the failure from them
        comm.Abort(1)
        raise


def _run(config: TrainConfig, comm: MPI.Comm, overrides: tuple[str, ...]) -> int | None:
    set_torch_threads()
    rank = comm.Get_rank()
    topology = Topology(config.topology)
    topology.check(comm.Get_size())  # every rank raises the same WorldSizeError before any work
    components = het_components()
    if components is not None:
        check_components(topology, components)  # the same PlacementError on every rank
    placement = topology.placement(rank)
    rank_hosts = comm.allgather(MPI.Get_processor_name())
    slots = gpu_slots(topology, rank_hosts)
    run_dir = Path(config.runs_dir) / config.run_name
    stop_flag = StopFlag()
    control = comm.Dup()
    # One job writes a run: the controller takes the run lock before any rank touches a file of the run.
    refused = None
    if rank == CONTROLLER:
        try:
            acquire_run_lock(run_dir)
        except RunLockedError as err:
            refused = str(err)
    refused = comm.bcast(refused, root=CONTROLLER)
    if refused is not None:
        raise RunLockedError(refused)
    log = setup_logging(run_dir, rank, f"{placement.role.value}[{placement.index}]") if rank != CONTROLLER else None

    # The controller decides where to resume from; learners get the state, env ranks the version (for seeding).
    resume = refused = None
    if rank == CONTROLLER:
        # Imported by the controller alone: its ratings (hpc_rl.league.ratings) bring SciPy, TrueSkill and some 400
        # modules that no other role uses, about 0.4 s of CPU every other rank would spend starting up.
        from hpc_rl.roles.controller import Controller, open_run_dir

        log = setup_logging(run_dir, rank, "controller")
        try:
            resume = open_run_dir(config, overrides)
        except ResumeError as err:
            log.error("%s", err)
            refused = str(err)
    resume_version, refused = comm.bcast((resume.version if resume is not None else -1, refused), root=CONTROLLER)
    if refused is not None:
        raise ResumeError(refused)
    # Every rank holds a connection to the controller until the end, so that a rank's death is named at once.
    lifelines = Lifelines(comm.Get_size()) if rank == CONTROLLER else None
    address, token = comm.bcast((lifelines.address, lifelines.token) if lifelines else None, root=CONTROLLER)
    lifeline = hold_lifeline(address, token, rank) if rank != CONTROLLER else None
    learner_ranks = topology.ranks(Role.LEARNER)
    populations = config.populations
    population = learner_population(placement.index, populations) if placement.role is Role.LEARNER else None
    if rank == CONTROLLER and resume is not None:
        for i, r in enumerate(learner_ranks):  # each learner its population's state
            control.send(population_sections(resume.sections, learner_population(i, populations), populations),
                         dest=r, tag=TAG_RESUME)
    learner_state = (control.recv(source=CONTROLLER, tag=TAG_RESUME) if resume_version >= 0 and rank in learner_ranks
                     else None)

    transport = Transport(comm, config.transport)
    go = config.env.is_go
    spec = None if go else config.env.make(num_envs=1).spec
    channels = open_channels(transport, config, spec, topology)
    learner_comm = comm.Split(color=1 if placement.role is Role.LEARNER else MPI.UNDEFINED, key=rank)
    # With populations each one's learners sum their gradients on a communicator of their own (its Horovod
    # instance); the control vector stays on every learner's.
    population_comm = (learner_comm.Split(color=population, key=rank) if population is not None and populations > 1
                       else None)
    endpoint = MpiControl(control)
    link = ControlLink(endpoint, config.pipeline.heartbeat_s)
    log.info("rank %d: pid %d, %s, transport %s, resume version %d", rank, os.getpid(), placement.role.value,
             transport.backend, resume_version)

    result = None
    learner = inference = producer = None  # producer: the rank that puts experience into the rings
    if placement.role is Role.CONTROLLER:
        write_meta(run_dir, world_size=comm.Get_size(), roles=topology.role_map(), rank_hosts=rank_hosts,
                   gpu_slots=slots, transport=transport.meta(), config_hash=config.config_hash(),
                   resumed_from=resume_version)
        controller = Controller(config, topology, endpoint, run_dir, resume_version, stop_flag, lifelines, overrides)
        result = controller.run()
    elif placement.role is Role.ENV and go:
        from hpc_rl.roles.go import GoEnvWorker

        producer = GoEnvWorker(config, rank, channels.steps, channels.rings, link, max(resume_version, 0))
        producer.run()
    elif placement.role is Role.ENV:
        EnvWorker(config, rank, placement.index, channels.steps, link, max(resume_version, 0)).run()
    elif placement.role is Role.INFERENCE and go:
        from hpc_rl.roles.go import GoInferenceWorker

        GoInferenceWorker(config, topology.envs_for_inference(placement.index), channels.steps, channels.params[0],
                          link, slots[rank]).run()
    elif placement.role is Role.INFERENCE:
        from hpc_rl.roles.inference import InferenceWorker

        inference = producer = InferenceWorker(config, spec, topology.envs_for_inference(placement.index),
                                               channels.steps, channels.rings, channels.params, link, slots[rank])
        inference.run()
    elif placement.role is Role.LEARNER:
        resumed = (resume_version, learner_state) if learner_state is not None else None
        if population_comm is None:
            allreduce, control_allreduce = make_allreduce(config.pipeline.allreduce, learner_comm), None
        else:
            allreduce = make_allreduce(config.pipeline.allreduce, population_comm)
            control_allreduce = MpiAllreduce(learner_comm)  # a few numbers per update, beside the population's
        if go:
            from hpc_rl.roles.go import GoLearnerWorker

            learner = GoLearnerWorker(config, allreduce, channels.rings[placement.index], channels.params[0], link,
                                      resumed, slots[rank])
        else:
            from hpc_rl.roles.learner import LearnerWorker

            learner = LearnerWorker(config, spec, allreduce, channels.rings[placement.index],
                                    channels.params[population], link, resumed, slots[rank], control_allreduce,
                                    population)
        learner.run()
        learner.final_checkpoint()
    elif placement.role is Role.EVALUATOR:
        from hpc_rl.roles.evaluator import Evaluator

        Evaluator(config, run_dir, link, resume_version).run()

    # Quiesce: wait for every rank to stop producing; learners drain, the controller keeps serving.
    barrier = control.Ibarrier()
    backoff = Backoff(config.transport.poll)
    left: list = []
    while not barrier.Test():
        if learner is not None:
            left = learner.drain()
        if placement.role is Role.CONTROLLER:
            controller.service()
        else:
            link.beat()
        if inference is not None:  # pool updates the controller sent before it stopped sending them
            inference.receive_pool()
        backoff.wait()
    if learner is not None:  # segments whose puts completed just before the last rank arrived
        left = learner.drain()
    if inference is not None:
        inference.receive_pool()
    if producer is not None:
        link.send({"produced": producer.produced_ids}, TAG_ACCOUNTING)
    if learner is not None:
        link.send({"consumed": learner.consumed_ids, "left": left}, TAG_ACCOUNTING)
    link.flush()
    done = control.Ibarrier()
    while not done.Test():
        if placement.role is Role.CONTROLLER:
            controller.service()
        time.sleep(0.001)
    if placement.role is Role.CONTROLLER:
        controller.service()
        controller.finish()

    extra = channels.close()
    if extra and learner is not None:
        log.info("%d segments arrived after the stop and were not trained on", len(extra))
    if learner is not None:
        learner.allreduce.shutdown()
    if population_comm is not None:
        population_comm.Free()
    if learner_comm != MPI.COMM_NULL:
        learner_comm.Free()
    control.Free()
    # Past the last barrier the controller no longer watches: ranks may end now.
    if lifeline is not None:
        lifeline.close()
    if lifelines is not None:
        lifelines.close()
    log.info("rank %d finished", rank)
    if placement.role is Role.CONTROLLER:
        # The final evaluation runs here, once no rank waits on the controller any more (the others wait in
        # MPI_Finalize, which has no timeout), and before a requeue ends the job.
        controller.conclude(evaluate=True)
        controller.requeue()
    return result

