"""A suite's progress lines reach `claimbench run`'s output while asv runs it (asv shows what a
benchmark printed only after it ends, and a setup_cache can run for hours)."""
import ast
import logging
import threading

from claimbench import registry, runner, suitelog

from .test_progressive import make_repo

LOGGING_SUITE = '''
import logging
import time

from claimbench import suitelog

suitelog.configure(__name__.rpartition(".")[0])  # as suites.common does: asv imports this as suites.talks
log = logging.getLogger(__name__)
INPUTS = ()


class Talks:
    def setup_cache(self):
        log.info("talks: first half")
        time.sleep(1.5)
        log.info("talks: second half")
        return 1.0

    def track_value(self, r):
        return r
    track_value.unit = "queries/s"
'''


def test_a_line_appended_while_the_block_runs_is_passed_on_during_it(tmp_path):
    path, said, arrived = tmp_path / "suites.log", [], threading.Event()

    def write(line):
        said.append(line)
        arrived.set()
    with suitelog.followed(path, write, poll_s=0.05):
        path.write_text("setup: half a li")
        with open(path, "a") as f:
            f.write("ne\n")
        assert arrived.wait(30), "the line was not passed on while the block ran"
        with open(path, "a") as f:
            f.write("the last line\n")
    assert [line.split(" ", 1)[1] for line in said] == ["setup: half a line", "the last line"]
    assert all(line.split(" ", 1)[0].count(":") == 2 for line in said)  # h:mm:ss since the block began


def test_configure_writes_only_under_claimbench_run(tmp_path, monkeypatch):
    loggers = [logging.getLogger(name) for name in ("claimbench", "suites")]
    before = [(list(logger.handlers), logger.level) for logger in loggers]
    try:
        monkeypatch.delenv(suitelog.ENV, raising=False)
        suitelog.configure("suites")
        assert [list(logger.handlers) for logger in loggers] == [handlers for handlers, _ in before]
        monkeypatch.setenv(suitelog.ENV, str(tmp_path / "suites.log"))
        suitelog.configure("suites")  # asv's name for the suites package
        suitelog.configure("claimbench.suites")  # the installed one's: under claimbench, no second handler
        suitelog.configure("suites")  # once per process
        logging.getLogger("claimbench.suites.x").info("x: step 1 of 3")
        logging.getLogger("suites.x").info("x: step 2 of 3")
        logging.getLogger("claimbench.llm.evaluate").info("  sample 1 of 2")
        logging.getLogger("elsewhere").warning("not ours")
        assert (tmp_path / "suites.log").read_text() == "x: step 1 of 3\nx: step 2 of 3\n  sample 1 of 2\n"
    finally:
        for logger, (handlers, level) in zip(loggers, before):
            for handler in set(logger.handlers) - set(handlers):
                handler.close()
                logger.removeHandler(handler)
            logger.setLevel(level)


def test_claimbench_run_prints_a_setup_caches_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    repo = make_repo(tmp_path, {"talks": LOGGING_SUITE})
    assert runner.run(registry.load(repo / "papers.toml"), quick=True, machine="box", bench=[r"^talks\."],
                      root=repo) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("claimbench: ") and "talks: " in line]
    assert [line.split(" ", 2)[2] for line in lines] == ["talks: first half", "talks: second half"], out


def test_progress_callbacks_get_no_print_only_arguments():
    """Suites and methods report progress through loggers (progress=log.info): a call that passes
    print's flush= to anything but print fails only when a real run reaches it."""
    offending = []
    for folder in ("suites", "impl", "baselines", "claimbench"):
        for path in (registry.REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "print")
                        and any(k.arg == "flush" for k in node.keywords)):
                    offending.append(f"{path.relative_to(registry.REPO_ROOT)}:{node.lineno}")
    assert offending == []
