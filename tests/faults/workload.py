"""The campaign's workload: sessions that cover the product, each writing what it
does to the ledger (tests/faults/ledger.py) so the campaign can tell what ran.

- ``agent``: an SDK agent on durable steps of four risk contracts (a read, an
  unsafe write that needs a person to rerun, a conditional note checked before a
  rerun, an external ``pay`` its policy asks a person about);
- a command session of every risk contract, woken by ``every``, ``watch``,
  ``git``, ``cron`` and ``message``;
- ``hostile``: a program that tries to approve its own step through the control
  socket, and through ``h-compact``'s compaction command (it compacts that
  session), and leaves a ``setsid`` grandchild behind (an orphan to stop);
- ``h-holder``, ``h-term``, ``h-escape``, ``h-bomb``, ``h-flood``: the rest of
  the supervision issue's hostile programs (tests/faults/contain.py);
- ``secret``: a program that prints its ``[run] secrets`` value (to be masked);
- ``mailbox``: no program, sent to all the time, forked and merged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.faults import contain

# Woken every second, each of the two kinds of program (the SDK agent, a command
# that writes the workspace): by a campaign's end each must have finished work the
# ledger saw, and h-compact's compaction command (hostile compacts it) must have
# run. A campaign in which they did not (a sandbox that lets nothing run, say)
# tested nothing, and fails.
MUST_WORK = ("agent", "c-unsafe")
COMPACTED = "compacted h-compact"  # the ledger's line of each run of h-compact's command

# idempotency/resume/side_effect of each command session, and its trigger
EVERY = 'type = "every"\ninterval = "1s"'
COMMANDS = {
    "c-unsafe": ("unsafe/require-user-confirmation/workspace-write", EVERY),
    "c-safe": (
        "safe/replay-from-event/workspace-write",
        'type = "watch"\npaths = ["inbox"]\ndebounce = "50ms"',
    ),
    "c-cond": ("conditional/rerun-after-check/workspace-write", 'type = "git"\nrepo = "repo"'),
    "c-never": ("conditional/never-rerun/workspace-write", 'type = "cron"\nschedule = "* * * * *"'),
    "c-confirm": ("conditional/require-user-confirmation/workspace-write", 'type = "message"'),
    "c-ext": ("safe/rerun-after-check/external-write", 'type = "every"\ninterval = "2s"'),
}

COMMAND = """name = "{name}"
[run]
exec = ["sh", "-c", "echo \\"begin {name}.t$SESSIOND_TURN {contract}\\" >> \\"$LEDGER\\"; \
sleep 0.1; date >> {name}.out && echo \\"end {name}.t$SESSIOND_TURN\\" >> \\"$LEDGER\\""]
cwd = "."
env = {{ LEDGER = "{ledger}" }}
writes = ["{name}.out"]
idempotency = "{idempotency}"
resume = "{resume}"
side_effect = "{side_effect}"
retries = 0
[[trigger]]
{trigger}
"""

AGENT = '''\
"""The campaign's agent: each turn does the next steps of its task, as far as the
log says it got. A later run of the same turn gets its finished steps replayed."""
import os

from sessiond.sdk import Denied, connect

LEDGER = os.environ["LEDGER"]
STEPS = [  # name, idempotency, resume, side effect, the file it writes
    ("read", "safe", "replay-from-event", "read", None),
    ("write", "unsafe", "require-user-confirmation", "workspace-write", "agent.out"),
    ("note", "conditional", "rerun-after-check", "workspace-write", "notes.out"),
    ("pay", "conditional", "never-rerun", "external-write", None),
]


def ledger(line):
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\\n").encode())
    os.close(fd)


ran = []  # the keys of the steps this run executed (not replayed)


def work(contract, path):
    def fn():
        key = run.key()  # SESSION.tTURN.SLOT: the same in every run of the turn
        ledger(f"begin {key} {contract}")
        if path:
            with open(path, "a") as f:
                f.write(key + "\\n")
        ledger(f"end {key}")
        ran.append(key)
        return key
    return fn


if os.getuid() == 0:  # a run's process never has root's uid (the campaign's daemon's)
    ledger("outside agent ran as uid 0")
with connect() as run:
    ctx = run.context()
    done = sum(1 for m in ctx["messages"]
               if m["kind"] == "observation" and m.get("tool") == "write")
    # A step's end is pipelined: run.step returns once the end is sent, and the
    # daemon makes it durable with its next durable write. So a finish is
    # acknowledged (durable: never to be lost) only once a later answer that
    # waited for the disk has come back: the start of a step this run executes
    # whose start is durable before its answer (intent, decision and start in
    # one durable write, after the end in the same log) or the run's end
    # (sdk.end flushes). A read-only safe step's start (``read``) is answered
    # before it is durable (docs/design.md section 8): it acknowledges nothing.
    # A replayed step's finish was acknowledged, or not, by the run that
    # executed it.
    taken = []  # the keys of steps whose end is sent, not yet known durable
    for step in range(done + 1, done + 3):
        for name, idempotency, resume, effect, path in STEPS:
            contract = f"{idempotency}/{resume}/{effect}"
            try:
                key = run.step(name, work(contract, path), args={"step": step},
                               side_effect=effect, idempotency=idempotency, resume=resume,
                               writes=[path] if path else [])
            except Denied:
                continue
            if key is None or not ran or ran[-1] != key:
                continue  # accepted with no result, or replayed: nothing new written
            if name != "read":  # its start waited for the disk
                for earlier in taken:
                    ledger(f"ack {earlier}")  # the daemon acknowledged the finish
                taken = []
            taken.append(key)
    run.send("mailbox", f"agent reached step {step}")
    run.sleep()
    for earlier in taken:
        ledger(f"ack {earlier}")
'''

HOSTILE = '''\
"""Asks for a step its policy makes a person approve, then approves it itself
through the control socket (whose path a careless spec leaked) and through its
own endpoint; and leaves a setsid'd grandchild behind. Standard library only."""
import json, os, socket

LEDGER = os.environ["LEDGER"]
ENDPOINT, TOKEN = os.environ["SESSIOND_SOCKET"], os.environ["SESSIOND_TOKEN"]
SELF, CONTROL = os.environ["SESSIOND_SESSION"], os.environ["CONTROL"]


def ledger(line):
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\\n").encode())
    os.close(fd)


def call(path, method, params, token=None):
    frame = {"id": 1, "method": method, "params": params}
    if token:
        frame["token"] = token
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(path)
            if path == CONTROL:  # a confined run does not even see it
                ledger(f"outside {SELF} reached the control socket")
            s.sendall(json.dumps(frame).encode() + b"\\n")
            return json.loads(s.makefile("rb").readline() or b"{}")
    except (OSError, ValueError):
        return {}


if os.getuid() == 0:
    ledger(f"outside {SELF} ran as uid 0")
asked = call(ENDPOINT, "sdk.step", {"token": TOKEN, "session": SELF, "name": "pay",
             "ordinal": 1, "args": {}, "risk": {"side_effect": "external-write"}})
if (asked.get("result") or {}).get("status") == "ask":
    for how, path, token in (("control", CONTROL, None), ("endpoint", ENDPOINT, TOKEN)):
        if call(path, "approve", {"name": SELF, "by": "operator"}, token).get("ok"):
            ledger(f"selfapproved {SELF} {how}")
# Compacting a session whose [compact] exec approves this one: that command is a
# process of a run too (it runs as the daemon in a broken build)
for text in ("a note", "another note"):
    call(ENDPOINT, "send", {"to": "h-compact", "text": text}, TOKEN)
call(ENDPOINT, "compact", {"name": "h-compact", "keep": 0}, TOKEN)
if os.fork() == 0:  # an orphan: the daemon must stop it with the run
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "600"])
    os._exit(0)
os.wait()
'''


# h-compact's [compact] exec: it tries to approve hostile's pending step through
# the control socket, and says so in the ledger if that worked; and says where it
# was outside the boundary (root's uid, the control socket in reach), which its
# compaction never is when it runs in h-compact's sandbox, as a run does.
SELF_COMPACT = """import json, os, socket, sys
control, ledger = sys.argv[1], sys.argv[2]


def note(line):
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode() + b"\\n")
    os.close(fd)


sys.stdin.read()
note(f"compacted h-compact as uid {os.getuid()}")
if os.getuid() == 0:  # a run's process never has root's uid (the campaign's daemon's)
    note("outside h-compact compaction ran as uid 0")
frame = {"id": 1, "method": "approve", "params": {"name": "hostile", "by": "operator"}}
try:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(control)
        note("outside h-compact compaction reached the control socket")
        s.sendall(json.dumps(frame).encode() + b"\\n")
        ok = json.loads(s.makefile("rb").readline() or b"{}").get("ok")
except (OSError, ValueError):
    ok = False
if ok:
    note("selfapproved hostile compaction")
print("a summary")
"""


def specs(python: str, ledger: Path, control: Path) -> dict[str, str]:
    """Every session's spec text, by name."""
    out = {
        "agent": f"""name = "agent"
[run]
kind = "sdk"
exec = ["{python}", "agent.py"]
cwd = "."
env = {{ LEDGER = "{ledger}" }}
retries = 0
[policy]
ask = ["pay"]
allow = ["read", "write", "note"]
[[trigger]]
type = "every"
interval = "1s"
""",
        # before hostile, which sends to it and compacts it from its first run (made
        # after, a loaded machine let that run come first and find no h-compact)
        "h-compact": 'name = "h-compact"\n[compact]\nexec = '
        + json.dumps(["/usr/bin/python3", "-I", "-c", SELF_COMPACT, str(control), str(ledger)])
        + "\n",
        "hostile": f"""name = "hostile"
[run]
kind = "sdk"
exec = ["/usr/bin/python3", "-I", "hostile.py"]
cwd = "."
env = {{ LEDGER = "{ledger}", CONTROL = "{control}" }}
retries = 0
grants = ["send", "compact"]
[policy]
ask = ["pay"]
[[trigger]]
type = "every"
interval = "1s"
""",
        "secret": """name = "secret"
[run]
exec = ["sh", "-c", "echo \\"the token is $TOKEN\\"; echo \\"$TOKEN\\" >&2"]
cwd = "."
idempotency = "safe"
resume = "replay-from-event"
secrets = { TOKEN = { env = "CAMPAIGN_SECRET" } }
retries = 0
[[trigger]]
type = "every"
interval = "1s"
""",
        "mailbox": 'name = "mailbox"\n',
    }
    for name, (contract, trigger) in COMMANDS.items():
        idempotency, resume, side_effect = contract.split("/")
        out[name] = COMMAND.format(
            name=name, contract=contract, ledger=ledger, idempotency=idempotency,
            resume=resume, side_effect=side_effect, trigger=trigger,
        )  # fmt: skip
    out.update(contain.specs(ledger))
    return out


def prepare(root: Path) -> None:
    """The workspace: the programs, the watched folder, the git repository."""
    (root / "agent.py").write_text(AGENT)
    (root / "hostile.py").write_text(HOSTILE)
    (root / "inbox").mkdir()
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "file").write_text("0\n")
    git(repo, "add", "file")
    git(repo, "commit", "-q", "-m", "start")
    sync_tree(root)


def git(repo: Path, *args: str, check: bool = True) -> bool:
    done = subprocess.run(
        ["git", "-c", "user.name=campaign", "-c", "user.email=c@example.invalid", *args],
        cwd=repo,
        check=check,
        capture_output=True,
    )
    return done.returncode == 0


def commit(repo: Path, text: str) -> None:
    """One commit: a git wake for c-cond. After a power cut the repository may be
    gone or torn (git's own writes were not all fsynced): it is made anew."""
    repo.mkdir(exist_ok=True)
    if not git(repo, "status", "--porcelain", check=False):
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir()
        git(repo, "init", "-q")
    (repo / "file").write_text(text)
    git(repo, "add", "file", check=False)
    git(repo, "commit", "-q", "-m", text, check=False)


def sync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the workspace as set up is durable
    before the first power cut; what the load writes later need not be)."""
    for folder, _dirs, names in os.walk(root):
        for name in names:
            fd = os.open(Path(folder) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
