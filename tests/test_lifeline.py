"""Lifelines between real processes: a rank SIGKILLed is reported once, by rank; strangers are never reported; a rank
that raised is reported with its last words while its process is still alive."""

import socket
import subprocess
import sys
import time

from hpc_rl.roles.lifeline import MAX_WORDS, Lifelines

# A "rank": hold a lifeline, say whether it connected, then wait to be killed.
RANK = ("import sys, time\n"
        "from hpc_rl.roles.lifeline import hold_lifeline\n"
        "held = hold_lifeline((sys.argv[1], int(sys.argv[2])), bytes.fromhex(sys.argv[3]), int(sys.argv[4]))\n"
        "print('held' if held else 'none', flush=True)\n"
        "time.sleep(600)\n")


def _until(condition, lifelines: Lifelines, timeout: float = 30.0) -> list[int]:
    """Poll ``lifelines.ended()`` until ``condition(ended so far)``; return what ended."""
    ended: list[int] = []
    deadline = time.monotonic() + timeout
    while not condition(ended):
        assert time.monotonic() < deadline, f"still waiting; ended {ended}, held {sorted(lifelines.held)}"
        ended += lifelines.ended()
        time.sleep(0.01)
    return ended


def test_a_killed_rank_is_reported_once_and_strangers_never():
    lifelines = Lifelines(4)
    host, port = lifelines.address
    procs = {rank: subprocess.Popen([sys.executable, "-c", RANK, host, str(port), lifelines.token.hex(), str(rank)],
                                    stdout=subprocess.PIPE, text=True) for rank in (1, 2, 3)}
    try:
        for proc in procs.values():
            assert proc.stdout.readline().strip() == "held"
        assert _until(lambda _: sorted(lifelines.held) == [1, 2, 3], lifelines) == []
        # Not the job's token, a second hello for a held rank, a rank outside the job: dropped, never reported.
        token = lifelines.token
        strangers = [socket.create_connection((host, port)) for _ in range(3)]
        for sock, hello in zip(strangers, (bytes(16) + (1).to_bytes(4, "big"), token + (1).to_bytes(4, "big"),
                                            token + (4).to_bytes(4, "big"))):
            sock.sendall(hello)
        time.sleep(0.5)
        assert lifelines.ended() == [] and sorted(lifelines.held) == [1, 2, 3]
        for sock in strangers:
            sock.close()
        time.sleep(0.5)
        assert lifelines.ended() == []

        procs[2].kill()
        procs[2].wait()
        assert _until(lambda ended: ended, lifelines) == [2]
        time.sleep(0.5)
        assert lifelines.ended() == [] and sorted(lifelines.held) == [1, 3]
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        lifelines.close()


# A "rank" that raised: hold a lifeline, say last words (argv[5]), then stay alive as a rank inside MPI_Abort does.
LAST_WORDS = ("import sys, time\n"
              "from hpc_rl.roles.lifeline import hold_lifeline, say_last_words\n"
              "hold_lifeline((sys.argv[1], int(sys.argv[2])), bytes.fromhex(sys.argv[3]), int(sys.argv[4]))\n"
              "say_last_words(sys.argv[5])\n"
              "print('said', flush=True)\n"
              "time.sleep(600)\n")


def test_a_rank_that_raised_is_reported_with_its_last_words_before_it_ends():
    lifelines = Lifelines(4)
    host, port = lifelines.address
    words = {1: "ValueError: device 'cuda' requested but CUDA is not available", 2: "RuntimeError: " + "é" * 3000}
    procs = {rank: subprocess.Popen([sys.executable, "-c", LAST_WORDS, host, str(port), lifelines.token.hex(),
                                     str(rank), text], stdout=subprocess.PIPE, text=True)
             for rank, text in words.items()}
    silent = subprocess.Popen([sys.executable, "-c", RANK, host, str(port), lifelines.token.hex(), "3"],
                              stdout=subprocess.PIPE, text=True)
    try:
        for proc in procs.values():
            assert proc.stdout.readline().strip() == "said"
        assert silent.stdout.readline().strip() == "held"
        assert sorted(_until(lambda ended: len(ended) == 2, lifelines)) == [1, 2]
        assert all(proc.poll() is None for proc in procs.values())  # reported while still running
        assert lifelines.last_words[1] == words[1]
        # Cut to MAX_WORDS bytes (a character split by the cut is replaced, not an error).
        long = lifelines.last_words[2]
        assert long.startswith("RuntimeError: ééé") and len(long.encode()) <= MAX_WORDS + 2
        silent.kill()
        silent.wait()
        assert _until(lambda ended: ended, lifelines) == [3] and 3 not in lifelines.last_words
    finally:
        for proc in [*procs.values(), silent]:
            proc.kill()
            proc.wait()
        lifelines.close()


def test_a_rank_that_cannot_reach_the_controller_says_so_and_goes_on(caplog):
    from hpc_rl.roles.lifeline import hold_lifeline

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    assert hold_lifeline(("127.0.0.1", port), bytes(16), 1, timeout_s=5) is None  # nothing listens there now
    assert "only heartbeats watch this rank" in caplog.text
