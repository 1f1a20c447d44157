"""nestor's warm worker process: started once per sweep (``NESTOR_ZYGOTE=1``),
it loads what every rank needs, then forks each rank the driver asks for.
The protocol is JSON lines: requests on stdin (``{"id", "env", "cwd",
"log", "blob"?}``), answers on stdout (``{"id", "pid"}`` or ``{"id",
"error"}``, then ``{"exited": pid, "status": raw}``); trainer/src/warm.rs is
the other side. No trial ever runs in the warm process itself: each rank is
a fresh fork of a process that never ran one, so no module state, thread,
process group or CUDA context of one trial reaches another.

Two warm processes use it:

- the Python driver's (``python -m nestor._worker BLOB``): ``nestor._worker``
  serves with the pickled training function loaded;
- a sweep whose ``command`` runs a Python script or module
  (``python train.py ...``, ``python -m pkg.train ...``): the driver runs
  this file itself with the interpreter and options of that command
  (``python [options] -c <this file> script|module TARGET ARGS...``). It
  imports what the script imports at its top level, once, then runs the
  script in each forked rank as ``python train.py`` would: ``__main__``,
  ``sys.argv``, ``sys.path[0]``, its exit code, a traceback and code 1 when
  it raises, ``atexit`` and non-daemon threads waited for at its end.

Standard library only: the second use needs nothing installed beside the
script's own imports.
"""

import ast
import gc
import json
import os
import selectors
import signal
import sys
import traceback


def _prctl_pdeathsig(sig):
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


def enter(req, parent, keep):
    """In a forked rank, before it runs: its own process group, death with
    the warm process, its log as stdout and stderr, its directory and
    variables, fresh random seeds. False when the warm process is already
    gone."""
    os.setpgid(0, 0)
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:
        return False
    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in keep:
        try:
            os.close(fd)
        except OSError:
            pass
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(req["cwd"])
    os.environ.update(req.get("env") or {})
    python_path()
    # The random module reseeds itself after fork; the others would repeat
    # the warm process's sequence in every rank.
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))  # OpenMP read the variable when torch loaded
    return True


def python_path():
    """Puts on ``sys.path`` what a fresh interpreter would have taken from
    ``PYTHONPATH`` and this process lacks, right after its first entry as
    Python does: a rank's own variable, or one its driver set after it
    started (this process may be a fork of that driver)."""
    have = {os.path.abspath(p) for p in sys.path if p}
    missing = []
    for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep):
        if p and os.path.abspath(p) not in have:
            have.add(os.path.abspath(p))
            missing.append(os.path.abspath(p))
    sys.path[1:1] = missing


def serve(run, load=None):
    """The warm process's loop: for each request, ``load(req)`` here (what
    that rank runs, loaded once in this process: raising answers the
    request with the error), then a fork that calls ``run(req, loaded)``
    and exits with what it returns; each rank's exit is reported."""
    out = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr; the protocol has its own fd
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    me = os.getpid()

    def send(msg):
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(out, data):]

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send({"exited": pid, "status": status})

    buf = b""
    while True:
        for key, _ in sel.select():
            if key.fd == wake_r:
                os.read(wake_r, 4096)
                reap()
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return  # the driver is gone; the ranks die with this process
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                try:
                    loaded = load(req) if load is not None else None
                except Exception as e:
                    send({"id": req["id"], "error": str(e)})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                # What this process holds is the ranks' to share, page for page: out of
                # the collector's reach, a rank's collections write none of it (a full
                # collection in a rank forked after torch's import copied 44 MB without).
                gc.freeze()
                try:
                    pid = os.fork()
                except OSError as e:
                    send({"id": req["id"], "error": f"fork failed: {e}"})
                    continue
                if pid == 0:
                    code = 1
                    try:
                        if enter(req, me, [out, wake_r, wake_w]):
                            code = run(req, loaded)
                    except BaseException:
                        traceback.print_exc()
                    finally:
                        try:
                            sys.stdout.flush()
                            sys.stderr.flush()
                        finally:
                            os._exit(code)
                send({"id": req["id"], "pid": pid})
        reap()


def imported_by(source, filename="<script>"):
    """The modules a script imports at its top level (inside ``if``,
    ``try`` and ``with`` blocks too, not inside functions or classes), in
    order: ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a`` and
    ``a.b`` (a submodule or a name, tried); relative imports are left out."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return []
    found = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.append(node.module)
                found.extend(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    todo[0:0] = [n for n in inner if isinstance(n, ast.AST)]
    return list(dict.fromkeys(found))


def preload(modules):
    """Imports each of ``modules`` that imports cleanly; one that fails is
    left for the rank to import (and to say why). What nestor's client
    needs to report is loaded too when the script uses it."""
    import importlib

    for name in modules:
        if name in sys.modules:
            continue
        parent = name.rpartition(".")[0]
        if parent and parent in sys.modules and hasattr(sys.modules[parent], name.rpartition(".")[2]):
            continue  # `from a import b` where b is a name in a, not a module
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: B036 (an import may raise anything, SystemExit too)
            pass
    if "nestor" in sys.modules:
        for name in ("grpc", "nestor._proto"):
            try:
                importlib.import_module(name)
            except BaseException:
                pass


def _exit_code(code):
    """A ``SystemExit``'s code as Python's own exit would give it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_exception(exc):
    """The traceback Python prints for an uncaught exception, without this
    file's and runpy's frames."""
    import runpy

    tb = exc.__traceback__
    ours = {"<string>", "<frozen runpy>", __file__ if "__file__" in globals() else "", runpy.__file__}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _run_file(path):
    """Runs the file as ``python path`` does: a fresh ``__main__`` module."""
    import builtins
    import importlib.machinery
    import types

    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __spec__=None,
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def run_target(kind, target, args):
    """In a rank: runs the script (or module) as ``__main__`` with its
    arguments, then what the interpreter does at its end; the exit code."""
    import runpy
    import threading

    code = 0
    sys.argv = [target, *args]
    try:
        if kind == "script":
            path = os.path.abspath(target)  # __file__ is absolute, as since Python 3.9
            if not os.path.exists(path):
                # What Python says, and its code, for a script it cannot open.
                print(f"{sys.executable}: can't open file {path!r}: [Errno 2] No such file or directory", file=sys.stderr)
                code = 2
            elif os.path.isfile(path):
                _run_file(path)
            else:
                runpy.run_path(path, run_name="__main__")  # a directory or zip with a __main__.py
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:
        _print_exception(e)
        code = 1
    try:
        threading._shutdown()  # non-daemon threads, as at the interpreter's exit
    except BaseException:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    return code


def main(argv):
    """``script|module TARGET ARGS...``: loads what TARGET imports, then serves."""
    if len(argv) < 2 or argv[0] not in ("script", "module"):
        print("usage: python -c <nestor's zygote> script|module TARGET [ARGS...]", file=sys.stderr)
        return 2
    kind, target, args = argv[0], argv[1], argv[2:]
    if kind == "script":
        path = os.path.abspath(target)
        # A directory or a zip with a __main__.py is its own first entry, as in Python.
        sys.path[0] = path if not os.path.isfile(path) else os.path.dirname(path)
        main_py = path if os.path.isfile(path) else os.path.join(path, "__main__.py")
        if os.path.isfile(main_py):
            with open(main_py, "rb") as f:
                preload(imported_by(f.read(), main_py))
    else:
        sys.path[0] = os.getcwd()
        import importlib.util

        try:
            spec = importlib.util.find_spec(target)
            origin = spec.origin if spec is not None else None
            if spec is not None and spec.submodule_search_locations:
                # A package run with -m runs its __main__.
                main_spec = importlib.util.find_spec(f"{target}.__main__")
                origin = main_spec.origin if main_spec is not None else None
        except BaseException:
            origin = None
        if origin and origin.endswith(".py"):
            with open(origin, "rb") as f:
                preload(imported_by(f.read(), origin))
        if "." in target:
            preload([target.rpartition(".")[0]])  # its package, as -m imports it
    serve(lambda _req, _loaded: run_target(kind, target, args))
    return 0


if __name__ == "__main__" and os.environ.get("NESTOR_ZYGOTE") == "1":
    sys.exit(main(sys.argv[1:]))
