"""CLI test fixtures: every probe in tests/cli/ runs through a runner that fails the test if a
command reaches "internal failure" (exit 1 is reserved for our own bugs, issue 30)."""

import pytest

from routepack_opt.cli import main as cli_main


@pytest.fixture
def run_cli(capsys):
    """Run ``routepack ARGS`` in-process; returns (exit code, stdout, stderr). No probe may end in
    an internal failure, whatever it expects otherwise."""

    def _run(*args):
        code = cli_main([str(a) for a in args])
        out, err = capsys.readouterr()
        assert "internal failure" not in err, (args, err)
        return code, out, err

    return _run
