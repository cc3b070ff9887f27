"""torch is an extra: where it is missing, the runtime and the seams say so in one error line."""

from __future__ import annotations

import sys

import pytest

from routepack_opt.core.deps import MissingDependency, require
from routepack_opt.core.errors import InputError


@pytest.fixture
def no_torch(monkeypatch):
    """A process without torch: ``import torch`` raises ModuleNotFoundError (name 'torch'), and the
    runtime package, the trainer seams' cached handles, and the CLI commands are imported anew."""
    for name in list(sys.modules):
        if name == "torch" or name.startswith(("torch.", "routepack_opt.runtime")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)
    from routepack_opt.integrations import _deps

    _deps.torch.cache_clear()
    _deps.torch_distributed.cache_clear()
    yield
    _deps.torch.cache_clear()
    _deps.torch_distributed.cache_clear()


def test_require_names_the_package_and_the_feature():
    with pytest.raises(MissingDependency) as exc:
        require("routepack_no_such_package.sub", "the feature X")
    msg = str(exc.value)
    assert isinstance(exc.value, InputError)
    assert msg == ("the feature X needs routepack_no_such_package, which is not installed: "
                   "pip install routepack_no_such_package")
    assert require("json", "anything").__name__ == "json"


def test_require_reraises_a_package_broken_inside(tmp_path, monkeypatch):
    """Installed but failing to import (a dependency of its own missing): its own error, unchanged."""
    (tmp_path / "routepack_broken_pkg.py").write_text("import routepack_missing_inner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as exc:
        require("routepack_broken_pkg", "the feature X")
    assert exc.value.name == "routepack_missing_inner"


def test_runtime_without_torch_is_one_error_line(no_torch, run_cli, tmp_path):
    with pytest.raises(MissingDependency, match=r"^the torch runtime .* needs torch, which is not installed: "
                       r"install your training environment's torch, or pip install 'routepack-opt\[torch\]'$"):
        import routepack_opt.runtime.batches  # noqa: F401
    for args in (["calibrate", "--quick", "-o", tmp_path / "c.toml"],
                 ["verify-runtime"]):
        code, out, err = run_cli(*args)
        assert code == 2, (args, err)
        assert err.count("\n") == 1 and err.startswith("error: the torch runtime") and "routepack-opt[torch]" in err
        assert out == ""
    assert not (tmp_path / "c.toml").exists()


def test_seams_without_torch_raise_missing_dependency(no_torch):
    from routepack_opt.integrations import _deps

    with pytest.raises(MissingDependency, match=r"^the trainer seams \(routepack_opt.integrations\) needs torch"):
        _deps.torch()
    with pytest.raises(MissingDependency):
        _deps.torch_distributed()
