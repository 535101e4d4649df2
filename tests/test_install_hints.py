"""A missing optional package names the extra that brings it, as pip takes it."""

from __future__ import annotations

import builtins

import pytest

from idlegpu.forecast.errors import PermanentError


@pytest.mark.parametrize("module, loader, blocked", [
    ("idlegpu.forecast.models.mstl_model", "_import_mstl", "statsmodels"),
    ("idlegpu.forecast.models.gbm_model", "_import_hgb", "sklearn"),
    ("idlegpu.forecast.models.prophet_model", "_import_prophet", "prophet"),
])
def test_a_missing_reference_model_says_pip_install_the_models_extra(module, loader, blocked,
                                                                    monkeypatch):
    import importlib

    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == blocked or name.startswith(blocked + "."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    mod = importlib.import_module(module)
    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(PermanentError, match=r"pip install 'idlegpu\[models\]'"):
        getattr(mod, loader)()
