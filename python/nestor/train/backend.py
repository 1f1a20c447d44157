"""Ray Train's developer API (``ray.train.backend``): a framework is a
``BackendConfig`` naming a ``Backend``, whose hooks set the ranks of a run
up before the training function runs and tear them down after it.

In nestor the hooks run in every rank of the run, at once, not in a driver
process beside them: ``worker_group`` is the group seen from one rank. Its
``execute(fn)`` runs ``fn`` here and returns every rank's result, in rank
order, on every rank (what Ray's ``WorkerGroup.execute`` returns to the
driver), and ``execute_single(i, fn)`` runs it on rank ``i`` alone and
returns its result everywhere. So code written for Ray's driver side (gather
the workers' addresses, compute the framework's settings, hand each rank
its part) runs unchanged in each rank, and comes to the same answer there.
What must happen once (a tracker started) is an ``execute_single``.

The group's exchanges go through a small hub that rank 0 opens on a port
free on its node, on the interface it tells the others (never every
interface); the other ranks learn its address from the nestor driver
(the report channel's rendezvous), so the same code works on one machine
and across Slurm nodes. Messages are pickled, after a greeting that
carries the run's token: a greeting is read with a size cap and a short
timeout, several at once, its token compared in constant time, and a
connection without the token is dropped before anything of it is unpickled.
"""

import hmac
import json
import os
import queue
import threading
import time
import pickle
import select
import socket
import struct
import sys
from typing import Any, Callable, List, Optional, Type

from .. import _contract

__all__ = ["Backend", "BackendConfig", "WorkerGroup", "run"]


class Backend:
    """What a framework does to the ranks of a run: ``on_start`` (the
    group is up: wire the ranks together), ``on_training_start`` (just
    before the training function), ``on_shutdown`` (after it, also when it
    failed). Each gets the ``WorkerGroup`` and the ``BackendConfig``."""

    #: Ray's switch to give every rank of a node all the node's GPUs; nestor
    #: gives each rank its bundle's GPUs (``CUDA_VISIBLE_DEVICES``).
    share_cuda_visible_devices: bool = False

    def on_start(self, worker_group: "WorkerGroup", backend_config: "BackendConfig") -> None:
        """The ranks are up: wire them together."""

    def on_training_start(self, worker_group: "WorkerGroup", backend_config: "BackendConfig") -> None:
        """Just before the training function runs."""

    def on_shutdown(self, worker_group: "WorkerGroup", backend_config: "BackendConfig") -> None:
        """The training function returned or raised."""


class BackendConfig:
    """A framework's settings; ``backend_cls`` is the ``Backend`` that
    applies them. Pickled with the trainer: keep it plain data."""

    @property
    def backend_cls(self) -> Type[Backend]:
        return Backend

    @property
    def train_func_context(self) -> Any:
        """A context manager the training function runs inside (Ray's hook;
        XGBoost's collective is one)."""
        import contextlib

        return contextlib.nullcontext


class WorkerGroup:
    """The ranks of one run, seen from one of them."""

    def __init__(self, rank: int, world_size: int, local_rank: int = 0, node_rank: int = 0):
        self.rank, self.world_size, self.local_rank, self.node_rank = rank, world_size, local_rank, node_rank
        self._hub: Optional[_Hub] = None

    def __len__(self) -> int:
        return self.world_size

    @property
    def node_ip(self) -> str:
        """The address the other ranks reach this rank's node at."""
        return _node_address()

    def all_gather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world_size <= 1:
            return [obj]
        if self._hub is None:
            self._hub = _Hub.join(self.rank, self.world_size)
        return self._hub.round(obj)

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; each rank's result, in rank order, on every rank."""
        return self.all_gather(fn(*args, **kwargs))

    def execute_single(self, rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on rank ``rank`` alone; its result on every rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"execute_single({rank}, ...): the group has ranks 0 to {self.world_size - 1}")
        return self.all_gather(fn(*args, **kwargs) if self.rank == rank else None)[rank]

    def broadcast_from_rank_zero(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        return self.all_gather(obj if self.rank == 0 else None)[0]

    def barrier(self) -> None:
        """Waits for every rank."""
        self.all_gather(None)

    def _close(self) -> None:
        if self._hub is not None:
            self._hub.close()
            self._hub = None


def _node_address() -> str:
    """This node's address as the ranks of other nodes reach it:
    ``MASTER_ADDR`` on rank 0's node (nestor sets it to that node's
    address), else the address of the interface this node reaches rank 0's
    node through."""
    master = os.environ.get("MASTER_ADDR")
    if master and os.environ.get("NODE_RANK", "0") == "0":
        return master
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT") or 9)))  # no packet is sent
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv(sock: socket.socket) -> bytes:
    head = _exactly(sock, 8)
    return _exactly(sock, struct.unpack("!Q", head)[0])


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("a rank of the group went away")
        out += chunk
    return bytes(out)


#: A greeting is small: longer ones, or ones slower than this, are dropped.
_HELLO_MAX_BYTES = 4096
_HELLO_TIMEOUT_S = 10.0
#: Greetings read at once (a stranger's slow connection holds one of them, not the hub).
_HELLO_READERS = 16


def _hello(conn: socket.socket, token: str, world_size: int) -> Optional[int]:
    """The rank a new connection greets as, once its token checks out; ``None`` for anything else."""
    try:
        conn.settimeout(_HELLO_TIMEOUT_S)
        n = struct.unpack("!Q", _exactly(conn, 8))[0]
        if n > _HELLO_MAX_BYTES:
            return None
        hello = json.loads(_exactly(conn, n))
    except (ConnectionError, ValueError, OSError, struct.error):
        return None
    if not isinstance(hello, dict):
        return None
    r, given = hello.get("rank"), hello.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        return None
    if not isinstance(r, int) or isinstance(r, bool) or not 0 < r < world_size:
        return None
    return r


class _Hub:
    """Rank 0's end holds a connection to every other rank; a round sends
    each rank's object to rank 0 and every object back to each rank."""

    def __init__(self, rank: int, peers: List[socket.socket]):
        self.rank, self.peers = rank, peers

    @staticmethod
    def join(rank: int, world_size: int) -> "_Hub":
        from .. import _get_channel, get_context

        ctx = get_context()
        token = _contract.token()
        plan = _contract.plan()
        timeout = plan.collective_timeout_s if plan else 1800.0
        channel = _get_channel()
        if rank == 0:
            address = _node_address()
            try:
                server = socket.create_server((address, 0))
            except OSError:
                # An address this node cannot listen on (a NAT's): loopback and the node's own interfaces.
                server = socket.create_server(("", 0))
            server.settimeout(timeout)
            channel.rendezvous(ctx, f"{address}:{server.getsockname()[1]}", timeout)
            peers: List[Optional[socket.socket]] = [None] * world_size
            greeted: "queue.Queue[tuple]" = queue.Queue()
            readers = threading.BoundedSemaphore(_HELLO_READERS)
            # A reader that has read a greeting wakes the accepting loop (no polling).
            wake_r, wake_w = socket.socketpair()

            def read_hello(conn: socket.socket) -> None:
                try:
                    greeted.put((conn, _hello(conn, token, world_size)))
                finally:
                    readers.release()
                    try:
                        wake_w.send(b"\0")
                    except OSError:
                        pass  # the group is formed (or given up): nobody waits

            deadline = time.monotonic() + timeout
            server.setblocking(False)
            try:
                while True:
                    # The greetings read so far, then the next connection or greeting.
                    while not greeted.empty():
                        conn, r = greeted.get()
                        if r is None or peers[r] is not None:
                            conn.close()  # not a rank of this run
                        else:
                            conn.settimeout(timeout)
                            peers[r] = conn
                    if all(p is not None for p in peers[1:]):
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        missing = [r for r in range(1, world_size) if peers[r] is None]
                        raise TimeoutError(f"ranks {missing} did not join rank 0's group within {timeout:g} s (NESTOR_COLLECTIVE_TIMEOUT_S)")
                    ready, _, _ = select.select([server, wake_r], [], [], remaining)
                    if wake_r in ready:
                        wake_r.recv(4096)
                    if server not in ready:
                        continue
                    try:
                        conn, _ = server.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(True)
                    if not readers.acquire(timeout=max(remaining, 0.0)):
                        conn.close()
                        continue
                    threading.Thread(target=read_hello, args=(conn,), daemon=True).start()
            finally:
                server.close()
                wake_r.close()
                wake_w.close()
            return _Hub(0, [p for p in peers[1:] if p is not None])
        host, port = channel.rendezvous(ctx, "", timeout).rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        _send(sock, json.dumps({"rank": rank, "token": token}).encode())
        return _Hub(rank, [sock])

    def round(self, obj: Any) -> List[Any]:
        if self.rank == 0:
            gathered = [obj] + [pickle.loads(_recv(p)) for p in self.peers]
            data = pickle.dumps(gathered)
            for p in self.peers:
                _send(p, data)
            return gathered
        _send(self.peers[0], pickle.dumps(obj))
        return pickle.loads(_recv(self.peers[0]))

    def close(self) -> None:
        for p in self.peers:
            try:
                p.close()
            except OSError:
                pass


def run(backend_config: BackendConfig, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in this rank between ``backend_config``'s
    hooks and inside its function context, as a trainer runs its training
    function: for ranks nestor starts from an experiment file's ``command``
    (every rank of the trial calls it). Returns what ``fn`` returns."""
    from .. import get_context

    if not isinstance(backend_config, BackendConfig):
        raise TypeError(f"run: backend_config is {type(backend_config).__name__}: give a nestor.train.backend.BackendConfig")
    return _run_hooks(backend_config, get_context(), lambda: fn(*args, **kwargs))


def _run_hooks(config: BackendConfig, ctx: Any, call: Callable[[], Any]) -> Any:
    """``call()`` between the backend's hooks, inside its function context (the rank's side of a trainer)."""
    backend = config.backend_cls()
    group = WorkerGroup(ctx.world_rank, ctx.world_size, ctx.local_rank, ctx.node_rank)
    try:
        for hook in (backend.on_start, backend.on_training_start):
            try:
                hook(group, config)
            except Exception as e:
                raise RuntimeError(f"{type(backend).__name__}.{hook.__name__} failed: {e}") from e
        with config.train_func_context():
            return call()
    finally:
        try:
            backend.on_shutdown(group, config)
        except Exception as e:  # the function's own outcome stands
            print(f"nestor: {type(backend).__name__}.on_shutdown raised: {e}", file=sys.stderr, flush=True)
        group._close()
