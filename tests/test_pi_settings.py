"""pi 1.6's compaction settings (``settings.json``) as :class:`CompactionSettings`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import orchestrator
from orchestrator import CompactionSettings, SessionError
from orchestrator._core.pi_settings import (
    branch_reserve_tokens_of,
    compaction_settings_of,
    merge_pi_settings,
    parse_pi_settings,
)

MODEL = "anthropic/claude-sonnet-4-5"


def settings_file(tmp_path: Path, value: Any, name: str = "settings.json") -> Path:
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def test_no_compaction_object_is_pi_defaults() -> None:
    assert compaction_settings_of({"theme": "dark"}) == CompactionSettings()
    assert compaction_settings_of({"compaction": None}) == CompactionSettings()


def test_each_field() -> None:
    settings = compaction_settings_of(
        {"compaction": {"enabled": False, "reserveTokens": 1000, "keepRecentTokens": 2000}}
    )
    assert (settings.enabled, settings.reserve_tokens, settings.keep_recent_tokens) == (
        False,
        1000,
        2000,
    )
    assert settings.adaptive_keep is True  # not pi's: untouched


def test_zero_and_a_whole_float_are_counts_as_in_pi() -> None:
    settings = compaction_settings_of({"compaction": {"reserveTokens": 0, "keepRecentTokens": 2e4}})
    assert (settings.reserve_tokens, settings.keep_recent_tokens) == (0, 20000)


def test_model_override_resolves_field_by_field() -> None:
    compaction = {
        "reserveTokens": 1000,
        "keepRecentTokens": 2000,
        "modelOverrides": {MODEL: {"keepRecentTokens": 50}, "openai/gpt-5": {"reserveTokens": 7}},
    }
    chosen = compaction_settings_of({"compaction": compaction}, model=MODEL)
    # The override's keep; the ordinary reserve (the override has none).
    assert (chosen.reserve_tokens, chosen.keep_recent_tokens) == (1000, 50)
    other = compaction_settings_of({"compaction": compaction}, model="openai/gpt-5")
    assert (other.reserve_tokens, other.keep_recent_tokens) == (7, 2000)
    unmatched = compaction_settings_of({"compaction": compaction}, model="openai/other")
    assert (unmatched.reserve_tokens, unmatched.keep_recent_tokens) == (1000, 2000)
    assert compaction_settings_of({"compaction": compaction}).reserve_tokens == 1000


def test_override_without_ordinary_value_falls_back_to_pi_default() -> None:
    compaction = {"modelOverrides": {MODEL: {"reserveTokens": 3}}}
    chosen = compaction_settings_of({"compaction": compaction}, model=MODEL)
    assert (chosen.reserve_tokens, chosen.keep_recent_tokens) == (3, 20000)


def test_only_the_override_of_the_model_in_use_is_checked_as_pi_does() -> None:
    compaction = {"modelOverrides": {"openai/gpt-5": {"reserveTokens": "lots"}}}
    assert compaction_settings_of({"compaction": compaction}, model=MODEL) == CompactionSettings()
    with pytest.raises(SessionError, match=r'modelOverrides\["openai/gpt-5"\]\.reserveTokens'):
        compaction_settings_of({"compaction": compaction}, model="openai/gpt-5")


@pytest.mark.parametrize(
    ("compaction", "message"),
    [
        ("on", 'f: compaction must be an object, not "on"'),
        ({"enabled": "false"}, 'f: compaction.enabled must be true or false, not "false"'),
        ({"reserveTokens": -1}, "f: compaction.reserveTokens must be a whole number of tokens"),
        ({"reserveTokens": 1.5}, "compaction.reserveTokens must be .*, not 1.5"),
        ({"keepRecentTokens": True}, "compaction.keepRecentTokens must be .*, not true"),
        ({"keepRecentTokens": None}, "compaction.keepRecentTokens must be .*, not null"),
        ({"keepRecentTokens": 2**53}, "compaction.keepRecentTokens must be .* 2\\^53 - 1"),
        ({"modelOverrides": []}, "compaction.modelOverrides must be an object, not \\[\\]"),
        ({"modelOverrides": {MODEL: 5}}, f'modelOverrides\\["{MODEL}"\\] must be an object'),
        # The ordinary value is checked even when the model's override replaces it (pi).
        (
            {"reserveTokens": "x", "modelOverrides": {MODEL: {"reserveTokens": 1}}},
            "compaction.reserveTokens must be",
        ),
    ],
)
def test_wrong_types_name_the_source_and_the_field(compaction: object, message: str) -> None:
    with pytest.raises(SessionError, match=message):
        compaction_settings_of({"compaction": compaction}, model=MODEL, source="f")


def test_a_long_wrong_value_is_named_by_its_kind() -> None:
    with pytest.raises(SessionError, match="must be an object, not a string$"):
        compaction_settings_of({"compaction": "x" * 100}, source="f")
    with pytest.raises(SessionError, match="reserveTokens must be .*, not an object$"):
        compaction_settings_of({"compaction": {"reserveTokens": {"x": "y" * 50}}}, source="f")


def test_parse_reads_what_json_parse_reads() -> None:
    assert parse_pi_settings(b"", "f") == {}
    assert parse_pi_settings(b'\xef\xbb\xbf{"a": 1}', "f") == {"a": 1}  # pi strips a BOM
    for data, message in [
        (b"{oops", "f: pi settings are not valid JSON"),
        (b'{"compaction": {"reserveTokens": NaN}}', "not valid JSON .*NaN is not JSON"),
        (b"[1]", "f: pi settings must be a JSON object, not an array"),
        (b"null", "must be a JSON object, not null"),
        (b"3", "must be a JSON object, not a number"),
        (b"true", "must be a JSON object, not a boolean"),
        (b'"x"', "must be a JSON object, not a string"),
        (b"\xff{}", "f: pi settings are not UTF-8 text"),
    ]:
        with pytest.raises(SessionError, match=message):
            parse_pi_settings(data, "f")


def test_merge_is_pi_deep_merge() -> None:
    base = {"compaction": {"reserveTokens": 1, "modelOverrides": {MODEL: {"reserveTokens": 2}}}}
    project = {"compaction": {"modelOverrides": {MODEL: {"keepRecentTokens": 3}}}, "theme": "x"}
    assert merge_pi_settings(base, project) == {
        "compaction": {
            "reserveTokens": 1,
            "modelOverrides": {MODEL: {"reserveTokens": 2, "keepRecentTokens": 3}},
        },
        "theme": "x",
    }
    assert merge_pi_settings({"compaction": {"a": 1}}, {"compaction": 5}) == {"compaction": 5}


def test_public_function_merges_files_in_order(tmp_path: Path) -> None:
    user = settings_file(
        tmp_path, {"compaction": {"reserveTokens": 1000, "keepRecentTokens": 2000}}, "user.json"
    )
    project = settings_file(
        tmp_path,
        {"compaction": {"enabled": False, "modelOverrides": {MODEL: {"keepRecentTokens": 9}}}},
        "project.json",
    )
    settings = orchestrator.pi_settings(user, project, model=MODEL)
    assert settings == CompactionSettings(enabled=False, reserve_tokens=1000, keep_recent_tokens=9)
    assert orchestrator.pi_settings(project, user).enabled is False  # user.json sets no enabled
    assert orchestrator.pi_settings() == CompactionSettings()


def test_public_function_names_the_file_the_bad_value_is_in(tmp_path: Path) -> None:
    good = settings_file(tmp_path, {"compaction": {"reserveTokens": 1}}, "good.json")
    bad = settings_file(tmp_path, {"compaction": {"keepRecentTokens": "x"}}, "bad.json")
    with pytest.raises(SessionError, match=f"^{bad}: compaction.keepRecentTokens must be"):
        orchestrator.pi_settings(good, bad)


def test_public_function_refuses_a_missing_file_or_a_folder(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="nope.json: cannot read pi settings: No such file"):
        orchestrator.pi_settings(tmp_path / "nope.json")
    with pytest.raises(SessionError, match="cannot read pi settings: Is a directory"):
        orchestrator.pi_settings(tmp_path)


def test_default_paths_are_pi_s(tmp_path: Path) -> None:
    user, project = orchestrator.pi_settings_paths(tmp_path, environ={})
    assert user == Path.home() / ".pi" / "agent" / "settings.json"
    assert project == tmp_path / ".pi" / "settings.json"
    moved, _ = orchestrator.pi_settings_paths(environ={"PI_CODING_AGENT_DIR": str(tmp_path)})
    assert moved == tmp_path / "settings.json"


def test_branch_reserve_is_pis_branch_summary_field_with_its_default() -> None:
    assert branch_reserve_tokens_of({}) == 16384
    assert branch_reserve_tokens_of({"branchSummary": None}) == 16384
    assert branch_reserve_tokens_of({"branchSummary": {"skipPrompt": True}}) == 16384
    assert branch_reserve_tokens_of({"branchSummary": {"reserveTokens": 0}}) == 0
    assert branch_reserve_tokens_of({"branchSummary": {"reserveTokens": 2e3}}) == 2000
    # compaction's reserve is another setting: it never leaks into the branch's.
    assert branch_reserve_tokens_of({"compaction": {"reserveTokens": 5}}) == 16384


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"branchSummary": []}, "f.json: branchSummary must be an object, not []"),
        (
            {"branchSummary": {"reserveTokens": "900"}},
            "f.json: branchSummary.reserveTokens must be a whole number of tokens from 0 to "
            '2^53 - 1, not "900"',
        ),
        ({"branchSummary": {"reserveTokens": -1}}, "branchSummary.reserveTokens must be"),
    ],
)
def test_a_wrong_branch_reserve_names_the_source_and_the_field(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(SessionError) as exc:
        branch_reserve_tokens_of(settings, source="f.json")
    assert message in str(exc.value)


def test_branch_reserve_files_merge_and_errors_name_the_file(tmp_path: Path) -> None:
    user = settings_file(tmp_path, {"branchSummary": {"reserveTokens": 1000}}, "user.json")
    project = settings_file(tmp_path, {"branchSummary": {"skipPrompt": True}}, "project.json")
    assert orchestrator.pi_branch_reserve_tokens(user, project) == 1000
    override = settings_file(tmp_path, {"branchSummary": {"reserveTokens": 7}}, "over.json")
    assert orchestrator.pi_branch_reserve_tokens(user, override) == 7
    assert orchestrator.pi_branch_reserve_tokens() == 16384
    bad = settings_file(tmp_path, {"branchSummary": {"reserveTokens": True}}, "bad.json")
    with pytest.raises(SessionError, match=r"bad\.json: branchSummary\.reserveTokens must be"):
        orchestrator.pi_branch_reserve_tokens(user, bad)
