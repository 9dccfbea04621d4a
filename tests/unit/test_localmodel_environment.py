"""`python -m agentstream.cli.localmodel` prints every variable that services and `trace verify` need,
AGENTSTREAM_DEFAULT_MODEL_OPTIONS (the llama.cpp quirks) included."""

from __future__ import annotations

import json
import shlex
import sys

from agentstream.cli import localmodel
from agentstream.models.endpoints import default_endpoint
from agentstream.ops.settings import Settings


class FakeServer:
    def __init__(self, **kwargs):
        self.base_url, self.model, self.ready_s, self.n_ctx = (
            "http://127.0.0.1:5555/v1",
            localmodel.MODEL_ALIAS,
            0.1,
            kwargs["n_ctx"],
        )

    endpoint_options = localmodel.LocalModelServer.endpoint_options

    def start(self):
        pass

    def stop(self):
        pass

    @property
    def running(self):
        raise KeyboardInterrupt  # Ctrl-C once the lines are printed


def test_main_prints_the_model_options_with_the_quirks(monkeypatch, capsys):
    monkeypatch.setattr(localmodel, "LocalModelServer", FakeServer)
    monkeypatch.setattr(sys, "argv", ["agentstream.cli.localmodel"])
    localmodel.main()
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == {"OPENAI_BASE_URL", "OPENAI_MODEL", "AGENTSTREAM_DEFAULT_MODEL_OPTIONS"}
    env = {name: shlex.split(value)[0] for name, value in lines.items()}
    options = json.loads(env["AGENTSTREAM_DEFAULT_MODEL_OPTIONS"])
    assert options["quirks"] == localmodel.LLAMA_CPP_QUIRKS and options["window_tokens"] == 8192
    settings = Settings(
        openai_base_url=env["OPENAI_BASE_URL"],
        openai_model=env["OPENAI_MODEL"],
        default_model_options=env["AGENTSTREAM_DEFAULT_MODEL_OPTIONS"],
    )
    endpoint = default_endpoint(settings)  # what a service started with these lines runs on
    assert endpoint.quirks.model_dump(exclude_defaults=True) == {
        k: v for k, v in localmodel.LLAMA_CPP_QUIRKS.items() if getattr(endpoint.quirks.__class__(), k) != v
    }
    assert endpoint.window_tokens == 8192
