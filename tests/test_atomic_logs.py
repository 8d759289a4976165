"""trainer.atomic's append-only JSON logs: what a reader makes of torn and garbled lines."""

from trainer.atomic import append_jsonl, read_jsonl


def test_read_jsonl_skips_torn_garbled_and_non_utf8_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"generation": 1})
    with open(path, "ab") as f:
        f.write(b'{"generation": 2, "sha\xff\xfe"\n[1, 2]\nnot json\n{"generation": 3}\n{"generat')
    assert read_jsonl(path) == [{"generation": 1}, {"generation": 3}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"generation": 1})
    with open(path, "ab") as f:
        f.write(b'{"generat')            # a writer killed mid-line
    append_jsonl(path, {"generation": 2})
    assert read_jsonl(path) == [{"generation": 1}, {"generation": 2}]
    assert path.read_bytes().endswith(b'{"generat\n{"generation":2}\n')

