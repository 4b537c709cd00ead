"""Sessions for servestack. Each one calls the library; run them in order, e.g.

    nox -s build image smoke -- --stack dev-cpu
"""

import hashlib
import shutil
from pathlib import Path

import nox
import nox.command

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["build", "image", "smoke"]


def _install(session: nox.Session, *extras: str) -> None:
    # Editable, so the code is live and only pyproject.toml (dependencies, entry points) calls for a
    # reinstall. uv reinstalls a named source tree every time and revalidates each dependency with
    # its index (2-5 s a session, and the network), so a stamp in the venv records what was
    # installed and a rerun with the same pyproject.toml skips it. `nox -N` recreates the venv.
    spec = f".[{','.join(extras)}]" if extras else "."
    stamp = Path(session.virtualenv.location) / ".servestack-installed"
    wanted = hashlib.sha256(Path("pyproject.toml").read_bytes() + b"\0" + spec.encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    session.install("-e", spec)
    stamp.write_text(wanted)


def _servestack(session: nox.Session, command: str, *extras: str) -> None:
    _install(session, *extras)
    # nox does not pass Ctrl-C on: on SIGINT it waits `interrupt_timeout`, then sends SIGTERM and
    # kills after `terminate_timeout`. servestack cancels its Slurm jobs and removes its containers
    # on SIGTERM; give it the seconds that takes, within the 7.5 s a GitHub runner allows (SIGINT,
    # then SIGTERM 7.5 s later, then kill).
    try:
        session.run("servestack", command, *session.posargs, interrupt_timeout=0.5, terminate_timeout=6.0)
    except nox.command.CommandFailed as failed:
        _exit_with(session, command, failed.return_code)


def _exit_with(session: nox.Session, command: str, code: int | None) -> None:
    """End nox with servestack's own exit code (README, "Exit codes"): nox would end every failed
    session with 1, and a script could no longer tell a wrong key (8) from a tag (2). SystemExit is
    not an Exception, so nox lets it through: the sessions after this one do not run (they need its
    records), and nox exits with the code."""
    if not code:  # nox could not start the command at all: its own failure, reported as such
        raise nox.command.CommandFailed(f"servestack {command} did not run")
    session.log(f"servestack {command} exited with {code} (README, \"Exit codes\"); nox ends with it")
    raise SystemExit(code)


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve pins/<stack>.yaml into pins/<stack>.lock (`-- --check` verifies it offline)."""
    _servestack(session, "lock")


@nox.session
def build(session: nox.Session) -> None:
    """Fetch and verify every locked input and apply PR overlays: build/<stack>/build.json."""
    _servestack(session, "build")


@nox.session
def image(session: nox.Session) -> None:
    """Write the image's layers, push what the registry lacks, check pins/<stack>.image.json: build/<stack>/image.json."""
    _servestack(session, "image")


@nox.session
def smoke(session: nox.Session) -> None:
    """Run the image by digest: static and serving probes, smoke.json + JUnit."""
    _servestack(session, "smoke")


@nox.session
def ablate(session: nox.Session) -> None:
    """Each PR's named check on the image and on the stack's variant without it (after smoke): build/<stack>/prs.json."""
    _servestack(session, "ablate")


@nox.session
def recipes(session: nox.Session) -> None:
    """Render, validate and check the srt-slurm recipes (`-- render --image REF@sha256:...`)."""
    _servestack(session, "recipes")


@nox.session
def accuracy(session: nox.Session) -> None:
    """GSM8K on the image by digest, through the pipeline's runner, gated."""
    _servestack(session, "accuracy", "report")


@nox.session
def throughput(session: nox.Session) -> None:
    """The throughput sweep on the image by digest, gated per concurrency point."""
    _servestack(session, "throughput", "report")


@nox.session
def pipeline(session: nox.Session) -> None:
    """smoke -> accuracy -> throughput for one pipeline."""
    _servestack(session, "pipeline", "report")


@nox.session
def compare(session: nox.Session) -> None:
    """Two runs or published digests side by side; fails on a regression beyond the noise (`-- A B`)."""
    _servestack(session, "compare", "report")


@nox.session
def bump(session: nox.Session) -> None:
    """lock --upgrade, build, image, smoke, stages, compare with the last published baseline: a drift report."""
    _servestack(session, "bump", "report")


@nox.session
def cancel(session: nox.Session) -> None:
    """Cancel the jobs a run left live after its process was killed (`-- --stack S --run-id ID`)."""
    _servestack(session, "cancel")


@nox.session
def outputs(session: nox.Session) -> None:
    """The stack's digests as GitHub step outputs; records and run reports as the step summary."""
    _servestack(session, "outputs")


# What ruff reads: the package, its tests, the sessions and the benchmark scripts (pyproject says which
# rules and why). mypy reads src/ (pyproject's [tool.mypy]): the tests call it, with fixtures as values.
LINTED = ("src", "tests", "noxfile.py", "benchmarks")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy on the code, actionlint (with shellcheck) on .github/: the gate before any test runs."""
    if shutil.which("shellcheck") is None:  # actionlint would skip every run: script silently
        session.error("shellcheck is not on PATH (Debian: apt-get install shellcheck; .ci/bootstrap installs it)")
    _install(session, "lint")
    session.run("ruff", "check", "--no-cache", *LINTED)
    session.run("mypy")
    workflows = sorted(str(p) for p in Path(".github/workflows").glob("*.yml"))
    session.run("actionlint", "-shellcheck", "shellcheck", "-config-file", ".github/actionlint.yaml", *workflows)


@nox.session
def benchmark(session: nox.Session) -> None:
    """The image build measured side by side: naive Dockerfile, cold, cold again, no-op, one change (benchmarks/)."""
    _install(session)
    session.run("python", "benchmarks/build.py", *session.posargs)


@nox.session
def keygen(session: nox.Session) -> None:
    """Make the ECDSA P-256 key pair publish signs with (`-- --key servestack.key`)."""
    _servestack(session, "keygen")


@nox.session
def publish(session: nox.Session) -> None:
    """Push the image's signed bundle as OCI referrers (`-- --key K [--to REG/REPO] [--run ID]`)."""
    _servestack(session, "publish")


@nox.session
def pull(session: nox.Session) -> None:
    """Verify a published image's bundle and write its recipes (`-- REF@sha256:... --key PUB --out DIR`)."""
    _servestack(session, "pull")


@nox.session
def verify(session: nox.Session) -> None:
    """Rebuild a published image from its signed lock; same digest? (`-- REF@sha256:... --key PUB --rebuild`)."""
    _servestack(session, "verify")


@nox.session
def tests(session: nox.Session) -> None:
    """The fast tests: no daemon, no image build (a test that asks for one fails)."""
    _install(session, "test")
    session.run("pytest", *session.posargs)


@nox.session
def e2e(session: nox.Session) -> None:
    """The end-to-end suite on real dockerd, registry and Slurm (what CI runs after the fast tests)."""
    _install(session, "test")
    # The slowest tests named in every log: how the suite's minutes are spent, run by run.
    session.run("pytest", "-m", "e2e", "--durations=25", *session.posargs)
