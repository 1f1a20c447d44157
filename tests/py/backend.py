"""A framework written against ``nestor.train.backend`` alone, as a third
party would (tests/tests/backend.rs): its backend gathers every rank's
address (Ray's driver-side ``execute``), starts something once
(``execute_single``), hands each rank its ring neighbours, runs the
training function inside its context, and cleans up after it. The ranks
then pass their rank around the ring over plain sockets.

Usage: backend.py DIR WORKERS [broken | torch]
Rank log lines: RANK <json>; the driver prints FAILED <error> for ``broken``
(its backend's on_start raises). ``torch``: a TorchTrainer whose ranks all-reduce their
ranks + 1 (SUM <total>).
"""

import contextlib
import json
import os
import socket
import sys
import threading
import time

from nestor import _contract, train
from nestor.train import RunConfig, ScalingConfig, TrainingFailedError
from nestor.train.backend import Backend, BackendConfig
from nestor.train.data_parallel_trainer import DataParallelTrainer

root, workers = sys.argv[1], int(sys.argv[2])
broken = len(sys.argv) > 3 and sys.argv[3] == "broken"

if len(sys.argv) > 3 and sys.argv[3] == "torch":
    # TorchTrainer on the same seam: its backend joins the ranks' process group before the function.
    from nestor.train.torch import TorchConfig, TorchTrainer

    assert isinstance(TorchConfig(), BackendConfig)

    def torch_loop():
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(train.get_context().get_world_rank() + 1)])
        dist.all_reduce(t)
        print("RANK " + json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
                                    "meet": _contract.plan().meet["kind"]}), flush=True)
        train.report({"sum": t.item()})

    result = TorchTrainer(torch_loop, scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
                          run_config=RunConfig(name=f"torch-{workers}", storage_path=os.path.join(root, "runs"))).fit()
    print(f"SUM {result.metrics['sum']}")
    sys.exit(0)


class RingConfig(BackendConfig):
    def __init__(self, greeting: str, broken: bool = False):
        self.greeting, self.broken = greeting, broken

    @property
    def backend_cls(self):
        return RingBackend

    @property
    def train_func_context(self):
        @contextlib.contextmanager
        def inside():
            os.environ["RING_INSIDE"] = "1"
            try:
                yield
            finally:
                os.environ.pop("RING_INSIDE", None)

        return inside


class RingBackend(Backend):
    def on_start(self, worker_group, backend_config):
        if backend_config.broken:
            raise ValueError("the ring found no peers")
        self.server = socket.create_server(("127.0.0.1", 0))
        port = self.server.getsockname()[1]
        # Ray's driver-side pattern: every rank's address gathered, each rank's part handed to it.
        peers = worker_group.execute(lambda: ["127.0.0.1", port, os.getpid()])
        os.environ["RING_PEERS"] = json.dumps(peers)
        self.leader = worker_group.execute_single(0, lambda: f"{backend_config.greeting} from {os.getpid()}")

    def on_training_start(self, worker_group, backend_config):
        os.environ["RING_LEADER"] = self.leader
        os.environ["RING_WORLD"] = str(len(worker_group))

        # The ring's receiving end: the previous rank's message.
        def serve():
            conn, _ = self.server.accept()
            RECEIVED.append(int(conn.recv(16).decode()))
            conn.close()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        worker_group.barrier()

    def on_shutdown(self, worker_group, backend_config):
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
        with open(os.path.join(root, f"shutdown-{worker_group.rank}-{os.getpid()}"), "w") as f:
            f.write("done")


RECEIVED = []


def loop(config):
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    peers = json.loads(os.environ["RING_PEERS"])
    host, port, _ = peers[(rank + 1) % world]
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(str(rank).encode())
    deadline = time.time() + 10
    while not RECEIVED and time.time() < deadline:
        time.sleep(0.01)
    print("RANK " + json.dumps({"rank": rank, "world": world, "inside": os.environ.get("RING_INSIDE"), "pid": os.getpid(),
                                "leader": os.environ.get("RING_LEADER"), "peers": peers, "from": RECEIVED[:1],
                                "env_world": os.environ.get("RING_WORLD")}), flush=True)
    train.report({"rank_sent": rank})


if __name__ == "__main__":
    trainer = DataParallelTrainer(loop, backend_config=RingConfig("hello", broken=broken),
                                  scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
                                  run_config=RunConfig(name=f"ring-{workers}{'-broken' if broken else ''}",
                                                       storage_path=os.path.join(root, "runs")))
    try:
        result = trainer.fit()
        print(f"DONE {result.metrics['rank_sent']}")
    except TrainingFailedError as e:
        print(f"FAILED {e}")
