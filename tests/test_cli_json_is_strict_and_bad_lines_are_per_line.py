"""The command's JSON: ``receive`` writes strict JSON only, ``send`` reads it back,
and a line of ``send --from`` that is not UTF-8 is one failed line.

Floats JSON cannot carry are written ``{"__float__": "nan"}`` ("inf",
"-inf"), as bytes are ``{"__bytes__": "<base64>"}``.
"""

import base64
import json
import math
import re

import pytest

from asgi_amqp.tools.jsonbytes import dumps, loads
from helpers import drain, run_cli


def _strict(text):
    def refuse(token):
        raise ValueError("not strict JSON: %s" % token)

    return json.loads(text, parse_constant=refuse)


def test_special_floats_are_objects_and_come_back():
    message = {"nan": math.nan, "inf": [math.inf, -math.inf], "b": b"\x00", "x": 1.5}
    text = dumps(message)
    assert _strict(text) == {
        "nan": {"__float__": "nan"},
        "inf": [{"__float__": "inf"}, {"__float__": "-inf"}],
        "b": {"__bytes__": "AA=="},
        "x": 1.5,
    }
    back = loads(text)
    assert math.isnan(back["nan"]) and back["inf"] == [math.inf, -math.inf]
    assert back["b"] == b"\x00" and back["x"] == 1.5


@pytest.mark.parametrize("text", ['{"__float__": "NaN"}', '{"__float__": 1}'])
def test_an_invalid_float_object_is_an_error(text):
    with pytest.raises(ValueError, match="__float__"):
        loads(text)


def test_receive_prints_strict_json_that_send_takes_back(cli_env, cli_layer):
    cli_layer.send("f.in", {"nan": math.nan, "inf": math.inf, "neg": -math.inf, "ok": 0.25})
    result = run_cli(["receive", "f.in", "-t", "0"], env=cli_env)
    assert result.exit_code == 0, result.stderr
    record = _strict(result.stdout)  # a strict parser (jq, JavaScript) reads it
    assert record["message"]["nan"] == {"__float__": "nan"}

    record["channel"] = "f.out"
    result = run_cli(["send", "--from", "-"], env=cli_env, input=json.dumps(record) + "\n")
    assert result.exit_code == 0, result.stderr
    [(channel, message)] = drain(cli_layer, ["f.out"])
    assert math.isnan(message["nan"])
    assert (message["inf"], message["neg"], message["ok"]) == (math.inf, -math.inf, 0.25)


def test_a_line_that_is_not_utf8_fails_alone(cli_env, cli_layer, tmp_path):
    source = tmp_path / "lines.jsonl"
    good = [json.dumps({"channel": "u.a", "message": {"n": n}}).encode() for n in (1, 3)]
    bad = b'{"channel": "u.a", "message": {"text": "caf\xe9"}}'  # Latin-1, not UTF-8
    source.write_bytes(good[0] + b"\n" + bad + b"\n" + good[1] + b"\n")

    result = run_cli(["send", "--from", str(source)], env=cli_env)
    assert result.exit_code == 1
    assert re.search(r"^line 2: not UTF-8 text \(byte 0xe9 at column \d+\)$", result.stderr, re.M)
    assert "sent 2, refused 0, in doubt 0, not sent 1," in result.stderr
    assert drain(cli_layer, ["u.a"]) == [("u.a", {"n": 1}), ("u.a", {"n": 3})]
    # The rejects file keeps the line's bytes exactly; a resume reports it as line 2 again.
    rejects = str(source) + ".rejects"
    with open(rejects) as handle:
        [record] = [json.loads(line) for line in handle]
    assert (record["line"], record["kind"]) == (2, "not sent")
    assert base64.b64decode(record["original_base64"]) == bad
    again = run_cli(["send", "--from", rejects], env=cli_env)
    assert again.exit_code == 1
    assert re.search(r"^line 2: not UTF-8 text", again.stderr, re.M), again.stderr
    with open(rejects) as handle:
        assert [json.loads(line) for line in handle] == [record]
