"""The agent's data on its Node travels in annotations (not conditions); an older agent's
conditions are still read; anything malformed is no report."""

from __future__ import annotations

import json

from gpufleet.domain import conditions, node_reports


def _node(**annotations: str) -> dict[str, object]:
    return {"metadata": {"annotations": annotations}, "status": {"conditions": []}}


def test_results_and_refusals_round_trip_and_a_refusal_is_no_result() -> None:
    done = node_reports.result(conditions.AgentResult("verify-1", passed=False, detail="gemm"))
    node = _node(**{done.key: done.value})
    assert node_reports.result_of(node) == conditions.AgentResult("verify-1", False, "gemm")
    refused = node_reports.refusal("gpu-reset-2", "the node has work")
    node = _node(**{refused.key: refused.value})
    answer = node_reports.answer_of(node)
    assert answer is not None and answer.outcome == "refused" and answer.id == "gpu-reset-2"
    assert node_reports.result_of(node) is None  # the controller waits (decision 0074)


def test_malformed_annotations_are_no_report() -> None:
    key = node_reports.ANNOTATION_AGENT_RESULT
    for text in ("", "{", json.dumps({"id": "x y", "outcome": "passed"}), '{"id":"a"}'):
        assert node_reports.answer_of(_node(**{key: text})) is None, text
    bad_outcome = json.dumps({"id": "a", "outcome": "maybe"})
    assert node_reports.answer_of(_node(**{key: bad_outcome})) is None


def test_an_older_agents_request_condition_is_still_read() -> None:
    old = conditions.AgentResult("verify-3", passed=True, detail="ok").condition()
    node = {
        "status": {
            "conditions": [
                {
                    "type": old.type,
                    "status": old.status,
                    "reason": old.reason,
                    "message": old.message,
                }
            ]
        }
    }
    assert node_reports.result_of(node) == conditions.AgentResult("verify-3", True, "ok")
    refused = conditions.refusal("gpu-reset-4", "busy")
    node["status"]["conditions"] = [  # type: ignore[index]
        {
            "type": refused.type,
            "status": refused.status,
            "reason": refused.reason,
            "message": refused.message,
        }
    ]
    answer = node_reports.answer_of(node)
    assert answer is not None and answer.outcome == "refused" and answer.id == "gpu-reset-4"
