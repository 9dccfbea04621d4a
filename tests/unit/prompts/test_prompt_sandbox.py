"""Prompt templates render in Jinja's immutable sandbox (issue 11, item 7): a prompt file cannot
reach Python, and what the sandbox forbids fails with a PromptFileError naming the file and line."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from agentstream.cli.commands import cli
from agentstream.declarations.prompts import PromptFileError, load_prompt_file

POPEN = "{{ cycler.__init__.__globals__.os.popen('echo PWNED > %s').read() }}"


def write(tmp_path, body: str):
    path = tmp_path / "evil.yaml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_a_template_cannot_run_a_shell_command(tmp_path):
    marker = tmp_path / "marker"
    path = write(
        tmp_path,
        f"""\
        system: |
          You help.
          {POPEN % marker}
        """,
    )
    prompts = load_prompt_file(str(path)).for_model(None)
    with pytest.raises(PromptFileError) as caught:
        prompts.system()
    message = str(caught.value)
    assert str(path) in message and "line 3" in message and "unsafe" in message, message
    assert not marker.exists()


@pytest.mark.parametrize(
    "expression, unsafe",
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "__class__"),
        ("{% set xs = [] %}{{ xs.append(1) }}", "append"),
        ("{{ {}.update(a=1) }}", "update"),
        ("{{ self.__init__.__globals__ }}", "__init__"),
    ],
)
def test_what_the_sandbox_forbids_names_file_and_line(tmp_path, expression, unsafe):
    path = write(
        tmp_path,
        f"""\
        # a comment line
        system: |
          line one
          line two {expression}
        """,
    )
    with pytest.raises(PromptFileError) as caught:
        load_prompt_file(str(path)).for_model(None).system()
    assert f"{path}', line 4" in str(caught.value) and unsafe in str(caught.value), str(caught.value)


def test_a_layer_block_names_its_own_line(tmp_path):
    path = write(
        tmp_path,
        """\
        system: |
          Base.{% block tools %} Tools.{% endblock %}
        models:
          - endpoints: [small]
            blocks:
              tools: |
                {{ super() }}
                {{ [].pop() }}
        """,
    )
    pf = load_prompt_file(str(path))
    assert pf.for_model("big").system() == "Base. Tools."
    with pytest.raises(PromptFileError) as caught:
        pf.for_model("small").system()
    assert "line 8 (model layer 0, block 'tools')" in str(caught.value), str(caught.value)


def test_agentstream_prompt_refuses_it_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    path = write(
        tmp_path,
        f"""\
        system: "{POPEN % marker}"
        """,
    )
    result = CliRunner().invoke(cli, ["prompt", str(path)])
    assert result.exit_code != 0 and not marker.exists()
    assert "sandbox" in result.output and "Traceback" not in result.output, result.output


def test_ordinary_templates_still_render(tmp_path):
    path = write(
        tmp_path,
        """\
        system: |
          {% for t in ['calc'] %}- {{ t|upper }}
          {% endfor %}{{ "%d items"|format(3) }} {{ range(3)|list|length }}
        """,
    )
    assert load_prompt_file(str(path)).for_model(None).system() == "- CALC\n3 items 3"
