#!/usr/bin/env python3
"""Cold starts of two threadgate builds side by side, measured from outside.

Driven by scripts/cold-start-compare.sh (read its header for usage). Each build runs
its own `threadgate serve` (SQLite, local Docker, the same sandbox image, its own data
directory, repository and secrets root); one scripted model (not a real model) serves
both. New threads alternate between the builds (A B, then B A, ...), one at a time, and
for each thread the script records, from the moment its signed webhook is sent:

  container  the engine's `start` event of the container labelled with the thread
             (`docker events`; a warm start adopts a parked container: no event)
  process    the agent runner's process first seen in /proc (cold starts: its
             environment names the thread)
  socket     the agent's first connection on its session socket, seen in the
             runner's /proc/<pid>/net/unix (an accepted connection carries the
             socket's path, in the namespace of the container that connected); this
             is the runner's first request (GET /v1/agent), whichever build serves it
  running    the session's row saying `running` (read-only SQLite reads)

Then the thread is marked done (a signed status change) so containers do not pile up.
Nothing of threadgate is linked in: the same script measures any two builds.
"""

import base64
import hashlib
import hmac
import json
import os
import random
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

IMAGE = os.environ.get("THREADGATE_SANDBOX_IMAGE", "threadgate-sandbox:latest")
POLL = 0.002  # seconds between two looks at /proc/net/unix and the session row
TIMEOUT = 60.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rfc3339(at):
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + (
        "%03dZ" % (at.microsecond // 1000)
    )


def plain_id(prefix):
    return prefix + "_" + uuid.uuid4().hex.upper()[:26]


class Plain:
    """Plain's example deliveries, re-aimed at a thread and signed (HMAC-SHA256, hex,
    over the raw body: what `threadgate::webhook::sign` does)."""

    def __init__(self, examples, secret):
        self.examples = examples
        self.secret = secret

    def body(self, name, thread, at):
        with open(os.path.join(self.examples, name)) as f:
            event = json.load(f)
        event["id"] = plain_id("pEv")
        event["timestamp"] = rfc3339(at)
        event["payload"]["thread"]["id"] = thread
        meta = event["webhookMetadata"]
        meta["webhookDeliveryAttemptId"] = "whAttempt_" + uuid.uuid4().hex
        meta["webhookDeliveryAttemptNumber"] = 1
        meta["webhookDeliveryAttemptTimestamp"] = rfc3339(datetime.now(timezone.utc))
        return json.dumps(event).encode()

    def send(self, addr, body):
        signature = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        request = urllib.request.Request(
            f"http://{addr}/webhooks/plain",
            data=body,
            headers={
                "Content-Type": "application/json",
                "Plain-Request-Signature": signature,
            },
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            if answer.status != 200:
                raise RuntimeError(f"webhook answered {answer.status}")


class DockerStarts:
    """`docker events` for container starts: the wall-clock time of each labelled
    thread's container start."""

    def __init__(self):
        self.starts = {}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [
                "docker", "events", "--filter", "type=container",
                "--filter", "event=start", "--format", "{{json .}}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            attrs = event.get("Actor", {}).get("Attributes", {})
            thread = attrs.get("threadgate.thread")
            if thread:
                with self.lock:
                    self.starts.setdefault(thread, event["timeNano"] / 1e9)

    def of(self, thread):
        with self.lock:
            return self.starts.get(thread)

    def stop(self):
        self.proc.terminate()


class AgentWatch:
    """The agent runner's process and its first connection on its session socket.

    A session socket's accepted connection lives in the network namespace of the
    socket that connected (the container's: `network_mode: none`), so it is not in
    the host's /proc/net/unix. Every 2 ms this looks for new `threadgate-agent-runner`
    processes in /proc (recording when each was first seen, under the thread its
    environment names: a cold start's; a parked runner names none) and reads each live
    runner's /proc/<pid>/net/unix, where a connection accepted on
    `<data_dir>/sockets/<session>/api.sock` shows with that path."""

    def __init__(self):
        self.dirs = ()
        self.first = {}
        self.process = {}
        self.runners = set()
        self.known = set()
        self.young = {}
        self.lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._poll, daemon=True).start()

    def watch(self, sockets_dir):
        with self.lock:
            self.dirs = self.dirs + (sockets_dir.rstrip("/") + "/",)

    def _new_runners(self, now):
        # A new process may still be the container's init before its exec: its name is
        # read again while it is younger than 2 s.
        pids = {p for p in os.listdir("/proc") if p.isdigit()}
        for pid in pids - self.known:
            self.young[pid] = now
        self.known = pids
        for pid, born in list(self.young.items()):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    runner = f.read().startswith("threadgate-agen")
                if runner:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\0")
            except OSError:
                # Gone, or between its fork and its exec: tried again while young.
                if now - born > 2.0 or not os.path.exists(f"/proc/{pid}"):
                    del self.young[pid]
                continue
            # Its environment reads empty until the new program's stack is set up,
            # a moment after its name changed at the exec.
            if not runner or env == [b""]:
                if now - born > 2.0:
                    del self.young[pid]
                continue
            del self.young[pid]
            self.runners.add(pid)
            for var in env:
                if var.startswith(b"THREADGATE_THREAD_ID="):
                    thread = var.split(b"=", 1)[1].decode()
                    with self.lock:
                        self.process.setdefault(thread, now)

    def _poll(self):
        while self.running:
            now = time.time()
            with self.lock:
                dirs = self.dirs
            if dirs:
                self._new_runners(now)
                for pid in list(self.runners):
                    try:
                        with open(f"/proc/{pid}/net/unix") as f:
                            lines = f.readlines()
                    except OSError:
                        self.runners.discard(pid)
                        continue
                    for line in lines:
                        parts = line.split()
                        if len(parts) >= 8 and parts[7].startswith(dirs):
                            with self.lock:
                                self.first.setdefault(parts[7], now)
            time.sleep(POLL)

    def connection(self, sockets_dir, session):
        with self.lock:
            return self.first.get(os.path.join(sockets_dir, session, "api.sock"))

    def process_of(self, thread):
        with self.lock:
            return self.process.get(thread)

    def stop(self):
        self.running = False


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def seed_repo(path):
    os.makedirs(path)
    git("init", "-q", "-b", "main", cwd=path)
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("a repository for cold-start-compare\n")
    git("add", ".", cwd=path)
    git("-c", "user.name=bench", "-c", "user.email=bench@example.com",
        "commit", "-q", "-m", "seed", cwd=path)


class Serve:
    """One `threadgate serve` with its own data directory, repository and secrets
    root. `extra` is more THREADGATE_* variables (the pool's, on a build that has it)."""

    def __init__(self, label, binary, root, common_env, extra, logs):
        self.label = label
        self.binary = binary
        self.data_dir = os.path.join(root, label, "data")
        self.sockets_dir = os.path.join(self.data_dir, "sockets")
        repo = os.path.join(root, label, "repo")
        seed_repo(repo)
        os.makedirs(self.data_dir)
        self.secrets_root = f"/dev/shm/tg-compare-{os.getpid()}-{label}"
        self.instance = f"cmp{os.getpid()}{label.replace('-', '')}"
        self.addr = f"127.0.0.1:{free_port()}"
        env = dict(os.environ)
        env.update(common_env)
        env.update({
            "THREADGATE_DATA_DIR": self.data_dir,
            "THREADGATE_LISTEN": self.addr,
            "THREADGATE_PUBLIC_URL": f"http://{self.addr}",
            "THREADGATE_REPO__PATH": repo,
            "THREADGATE_SANDBOX__SECRETS_ROOT": self.secrets_root,
            "THREADGATE_SANDBOX__IMAGE": IMAGE,
            # Set, not generated: a pre-pool build keeps a generated one in the database.
            "THREADGATE_INSTANCE_ID": self.instance,
        })
        env.update(extra)
        self.log_path = os.path.join(logs, f"{label}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT,
            cwd=os.environ["COMPARE_REPO_ROOT"],
        )
        self.db = None

    def wait_ready(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label}: serve exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://{self.addr}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        else:
            raise RuntimeError(f"{self.label}: not healthy after 120 s; see {self.log_path}")
        uri = "file:" + os.path.join(self.data_dir, "threadgate.db") + "?mode=ro"
        self.db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self.db_lock = threading.Lock()

    def session(self, thread):
        with self.db_lock:
            try:
                return self.db.execute(
                    "SELECT session_id, state FROM sessions WHERE thread_id = ?", (thread,)
                ).fetchone()
            except sqlite3.OperationalError:
                return None

    def parked(self):
        out = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=threadgate.instance={self.instance}",
             "--filter", "label=threadgate.pool"],
            capture_output=True, text=True,
        ).stdout
        return len(out.split())

    def launches(self):
        """`threadgate_session_launches_total` by launch type, from the log lines
        "session has its sandbox" (launch=warm|cold); empty on a build without them."""
        counts = {"warm": 0, "cold": 0}
        with open(self.log_path) as f:
            for line in f:
                if "session has its sandbox" in line:
                    for kind in counts:
                        if (f"launch={kind}" in line or f'launch="{kind}"' in line
                                or f'"launch":"{kind}"' in line):
                            counts[kind] += 1
        return counts

    def start_took(self):
        """The build's own "session start finished took_ms=N" lines (worktree, its
        filesystem, socket and container: the start off the supervisor), in seconds,
        the warm-up's first left out."""
        took = []
        with open(self.log_path) as f:
            for line in f:
                if "session start finished" in line and "took_ms=" in line:
                    value = line.split("took_ms=", 1)[1].split()[0].strip('",')
                    if value.isdigit():
                        took.append(int(value) / 1000)
        return took[1:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # A clean stop leaves containers running (the next start adopts them): remove
        # this instance's, parked ones included.
        if self.instance:
            ids = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=threadgate.instance={self.instance}"],
                capture_output=True, text=True,
            ).stdout.split()
            if ids:
                subprocess.run(["docker", "rm", "-f", *ids], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        unmount_under(self.secrets_root)
        shutil.rmtree(self.secrets_root, ignore_errors=True)
        # A worktree's filesystem still mounted (a session stopping when serve stopped).
        unmount_under(self.data_dir)
        self.log.close()


def unmount_under(root):
    """Unmounts whatever is mounted under `root` (a pool's slot binds), deepest first,
    so removing the directory never removes through a mount."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    points = [p for p in points if p == root or p.startswith(root.rstrip("/") + "/")]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], stderr=subprocess.DEVNULL)


class Sample:
    def __init__(self):
        self.container = None
        self.process = None
        self.socket = None
        self.running = None


def one_thread(serve, plain, starts, sockets, mark_done=True):
    """Sends a new thread's webhook and waits for its socket's first connection and
    its row saying running; the container start is read when the event arrives."""
    thread = "th_" + uuid.uuid4().hex.upper()[:26]
    body = plain.body("thread-created.json", thread, datetime.now(timezone.utc))
    sample = Sample()
    sent = time.time()
    plain.send(serve.addr, body)
    session = None
    while time.time() - sent < TIMEOUT:
        if sample.running is None:
            row = serve.session(thread)
            if row:
                session = row[0]
                if row[1] == "running":
                    sample.running = time.time() - sent
        if session and sample.socket is None:
            at = sockets.connection(serve.sockets_dir, session)
            if at is not None:
                sample.socket = at - sent
        if sample.running is not None and sample.socket is not None:
            break
        time.sleep(POLL)
    else:
        log(f"{serve.label}: {thread}: no socket connection / running row after {TIMEOUT} s")
    # The container's start event may arrive a little after; give it a moment.
    deadline = time.time() + 1.0
    while time.time() < deadline:
        at = starts.of(thread)
        if at is not None:
            sample.container = at - sent
            break
        time.sleep(0.01)
    at = sockets.process_of(thread)
    if at is not None:
        sample.process = at - sent
    if mark_done:
        done_at = datetime.now(timezone.utc) + timedelta(seconds=1)
        plain.send(serve.addr, plain.body("thread-status-transitioned.json", thread, done_at))
    return sample


def percentile(sorted_values, p):
    i = round((len(sorted_values) - 1) * p)
    return sorted_values[min(i, len(sorted_values) - 1)]


def summary(label, values):
    values = sorted(v * 1000 for v in values if v is not None)
    if not values:
        print(f"{label:<44} no samples")
        return
    print(
        f"{label:<44} n={len(values):<3} min {values[0]:7.1f}  p50 {percentile(values, 0.5):7.1f}"
        f"  p90 {percentile(values, 0.9):7.1f}  p99 {percentile(values, 0.99):7.1f}"
        f"  max {values[-1]:7.1f} ms",
        flush=True,
    )


def main():
    old_bin, new_bin = sys.argv[1], sys.argv[2]
    threads = int(os.environ.get("COMPARE_THREADS", "30"))
    stream_secs = int(os.environ.get("COMPARE_STREAM_SECS", "60"))
    pool_size = os.environ.get("COMPARE_POOL_SIZE", "2")
    gap = float(os.environ.get("COMPARE_GAP_SECS", "1.0"))
    examples = os.environ["COMPARE_PLAIN_EXAMPLES"]
    repo_root = os.environ["COMPARE_REPO_ROOT"]
    root = tempfile.mkdtemp(prefix="tg-cold-compare-")
    logs = os.path.join(root, "logs")
    os.makedirs(logs)
    signing = secrets.token_hex(32)
    plain = Plain(examples, signing)
    model_port = free_port()
    model = subprocess.Popen(
        [new_bin, "scripted-model", "--listen", f"127.0.0.1:{model_port}"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(logs, "model.log"), "w"),
    )
    common = {
        "THREADGATE_PLAIN_SIGNING_SECRET": signing,
        "THREADGATE_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
        "THREADGATE_AGENTS_DIR": os.path.join(repo_root, "agents"),
        "THREADGATE_POLICY_FILE": os.path.join(repo_root, "policies/support.yaml"),
        "THREADGATE_MODEL__BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "THREADGATE_SESSIONS__MAX_LIVE": "64",
        "THREADGATE_LOG_FORMAT": "text",
        "NO_COLOR": "1",
        "RUST_LOG": "info",
    }
    starts, sockets = DockerStarts(), AgentWatch()
    serves = []
    try:
        print(f"old: {old_bin}\nnew: {new_bin}\nimage: {IMAGE}; logs and data in {root}")
        print(f"load average at start: {load_average()}", flush=True)
        old = Serve("old", old_bin, root, common, {}, logs)
        serves.append(old)
        new = Serve("new", new_bin, root, common,
                    {"THREADGATE_SESSIONS__POOL_SIZE": "0"}, logs)
        serves.append(new)
        for s in (old, new):
            s.wait_ready()
            sockets.watch(s.sockets_dir)
        print(f"== cold: {threads} threads each, alternating, one at a time "
              f"(new build with sessions.pool_size = 0) ==", flush=True)
        # One warm-up thread each (the image's first start, the repository's first
        # worktree), not counted.
        for s in (old, new):
            one_thread(s, plain, starts, sockets)
        samples = {"old": [], "new": []}
        for i in range(threads):
            order = (old, new) if i % 2 == 0 else (new, old)
            for s in order:
                time.sleep(gap)
                samples[s.label].append(one_thread(s, plain, starts, sockets))
        for label in ("old", "new"):
            summary(f"{label}: webhook -> container running",
                    [x.container for x in samples[label]])
        for label in ("old", "new"):
            summary(f"{label}: webhook -> agent process seen",
                    [x.process for x in samples[label]])
        for label in ("old", "new"):
            summary(f"{label}: webhook -> agent's first connection",
                    [x.socket for x in samples[label]])
        for label in ("old", "new"):
            summary(f"{label}: webhook -> session row running",
                    [x.running for x in samples[label]])
        for label, s in (("old", old), ("new", new)):
            summary(f"{label}: its log's session start took_ms", s.start_took())
        print(f"load average after the cold threads: {load_average()}", flush=True)
        print(f"new build's launches (log): {new.launches()}")
        for s in list(serves):
            s.stop()
            serves.remove(s)
        if stream_secs > 0:
            stream(new_bin, root, common, logs, plain, starts, sockets, stream_secs, pool_size)
        print(f"load average at the end: {load_average()}", flush=True)
    finally:
        for s in serves:
            s.stop()
        starts.stop()
        sockets.stop()
        model.terminate()
        model.wait()
        if os.environ.get("COMPARE_KEEP") != "1":
            shutil.rmtree(root, ignore_errors=True)


def stream(new_bin, root, common, logs, plain, starts, sockets, secs, pool_size):
    """The new build with its pool: one new thread per second for `secs` seconds."""
    print(f"== warm: the new build, pool {pool_size} per agent, one new thread per second "
          f"for {secs} s ==", flush=True)
    warm = Serve("new-pool", new_bin, root, common,
                 {"THREADGATE_SESSIONS__POOL_SIZE": pool_size}, logs)
    try:
        warm.wait_ready()
        sockets.watch(warm.sockets_dir)
        deadline = time.time() + 60
        while warm.parked() < int(pool_size) and time.time() < deadline:
            time.sleep(0.1)
        if warm.parked() < int(pool_size):
            print("the pool did not fill in 60 s (not root? warm starts are off then)")
        before = warm.launches()
        results = [None] * secs
        workers = []
        started = time.time()
        for i in range(secs):
            time.sleep(max(0.0, started + i - time.time()))

            def work(i=i):
                results[i] = one_thread(warm, plain, starts, sockets)

            t = threading.Thread(target=work)
            t.start()
            workers.append(t)
        for t in workers:
            t.join()
        after = warm.launches()
        hits = after["warm"] - before["warm"]
        total = hits + after["cold"] - before["cold"]
        summary("pool: webhook -> agent's first connection", [x.socket for x in results if x])
        summary("pool: webhook -> session row running", [x.running for x in results if x])
        cold_seen = sum(1 for x in results if x and x.container is not None)
        rate = 100.0 * hits / total if total else 0.0
        print(f"hit rate: {hits} warm / {total} launches = {rate:.1f}% "
              f"(from outside: {cold_seen} of {secs} threads had a container started for them)")
        print(f"load average after the stream: {load_average()}", flush=True)
    finally:
        warm.stop()


if __name__ == "__main__":
    random.seed()
    main()
