"""Step exchange: rank 0 serves every other rank (env ranks) for a number of steps, observations in FP16.

argv: backend steps fp16(0|1)
Each env packs an observation built from (env rank, step) with ArrayLayout; inference checks it and answers with
actions computed from it; the env checks the answer. Prints one JSON line on rank 0.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import Transport, TransportConfig, step_reply_layout

E, A = 4, 2
OBS = {"global": ((E, A, 5), np.dtype(np.float32)), "action_mask": ((E, A, 3), np.dtype(bool))}


def observation(env_rank: int, step: int) -> dict:
    rng = np.random.default_rng([env_rank, step])
    return {"global": rng.normal(size=(E, A, 5)).astype(np.float32), "action_mask": rng.random((E, A, 3)) < 0.5,
            "reward": np.full((E, A, 1), step, np.float32), "done": np.arange(E) == step % E}


def actions_for(obs: dict) -> dict:
    return {"action": obs["action_mask"].argmax(-1), "move": np.full((E, A), int(obs["reward"][0, 0, 0])),
            "target": (obs["global"][..., 0] > 0).astype(np.int64)}


def main() -> None:
    backend, steps, fp16 = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=30, fp16_observations=fp16))
    request = transport.step_request_layout(OBS, E, A, 1)
    reply = step_reply_layout(E, A)
    steps_ex = transport.step_exchange({env: 0 for env in range(1, size)}, request.nbytes, reply.nbytes)
    if rank == 0:
        served, bad_requests, max_obs_error = 0, 0, 0.0
        for _ in range(steps):
            for env_rank, payload in steps_ex.wait_requests(steps_ex.clients_of(0)).items():
                obs = request.unpack(payload)
                want = observation(env_rank, served // (size - 1) + 1)
                max_obs_error = max(max_obs_error, float(np.abs(obs["global"] - want["global"]).max()))
                if not all(np.array_equal(obs[k], want[k]) for k in ("action_mask", "reward", "done")):
                    bad_requests += 1
                steps_ex.send_reply(env_rank, reply.pack(actions_for(want)))
                served += 1
        steps_ex.close()
        bad_replies = sum(comm.gather(0, root=0)[1:])
        print(json.dumps({"backend": transport.backend, "served": served, "bad_requests": bad_requests,
                          "bad_replies": bad_replies, "max_obs_error": max_obs_error,
                          "request_bytes": request.nbytes}))
    else:
        bad = 0
        for step in range(1, steps + 1):
            obs = observation(rank, step)
            steps_ex.send_request(request.pack(obs))
            got = reply.unpack(steps_ex.wait_reply())
            want = actions_for(obs)
            bad += sum(not np.array_equal(got[k], want[k]) for k in want)
        steps_ex.close()
        comm.gather(bad, root=0)


main()
