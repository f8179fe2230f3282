"""`eos init` writes only a starter that validates, and never overwrites a file that is not its own."""

from __future__ import annotations

from eos.cli import main
from eos.config import load_pipeline


def test_a_second_starter_in_the_same_folder_shares_the_schema_file(tmp_path):
    assert main(["init", str(tmp_path / "first.yaml")]) == 0
    assert main(["init", str(tmp_path / "my orders.yaml")]) == 0
    assert load_pipeline(tmp_path / "my orders.yaml", env={}).name == "my-orders"
    assert main(["init", str(tmp_path / "first.yaml")]) == 2  # exists: --force overwrites it


def test_names_a_pipeline_cannot_take_are_refused_and_nothing_is_written(tmp_path, capsys):
    assert main(["init", str(tmp_path / "p.yaml"), "--input", "two words"]) == 2
    assert "sources.0.kafka.topics.0" in capsys.readouterr().err
    assert main(["init", str(tmp_path / "p.yaml"), "--name", "a/b"]) == 2
    assert list(tmp_path.iterdir()) == []


def test_a_schema_file_that_is_not_eos_is_kept(tmp_path, capsys):
    (tmp_path / "pipeline.schema.json").write_text('{"title": "my own schema"}')
    assert main(["init", str(tmp_path / "p.yaml")]) == 2
    assert "is not eos's" in capsys.readouterr().err
    assert (tmp_path / "pipeline.schema.json").read_text() == '{"title": "my own schema"}'
    assert not (tmp_path / "p.yaml").exists()
    assert main(["init", str(tmp_path / "p.yaml"), "--force"]) == 0
