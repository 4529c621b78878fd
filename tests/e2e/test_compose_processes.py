"""docker-compose.yml's stack run as processes, and one loop through it (`make prod-smoke`).

deploy/smoke/compose_as_processes.py reads docker-compose.yml and .env.example and starts each
service natively with the environment compose would give it: PostgreSQL as an external server
(TCP, password), moto's S3 server with minio-init's bucket and limited user, `cft engine` where
vllm would be, every cft service's command with imports limited to its image's install. The
loop: logs + feedback, snapshot, training run (artefact to S3), evaluator, canary loaded by the
api's reconciler, promotion, and a chat call served by the promoted adapter. Progress lines are
printed as it goes; on failure each service's log tail is printed and put in the message.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deploy.smoke import compose_as_processes as smoke

pytestmark = pytest.mark.slow


def test_compose_stack_runs_as_processes(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def say(line: str) -> None:
        with capsys.disabled():
            print(line, flush=True)

    base = str(models_dir / "smollm2-135m-instruct")
    start = time.monotonic()
    # The compose file's vllm service runs as itself: vLLM (its CPU build), with the service's
    # flags and environment, so the chat at the end is served by vLLM with the promoted adapter.
    stack = smoke.Stack(tmp_path / "stack", base_model=base, say=say, engine="vllm-cpu")
    with stack:
        try:
            result = smoke.run_loop(stack, say=say)
        except smoke.SmokeError as exc:
            pytest.fail(f"{exc}\n{stack.tails()}")
        # Each service ran as its image would: the control plane with no ML stack at all.
        api_path = stack.service_env("api")["PYTHONPATH"]
        assert "blockers/core" in api_path
        assert "blockers/cpu" in stack.service_env("trainer")["PYTHONPATH"]
        assert stack.sql(
            "SELECT status FROM serve.adapter WHERE id = %s", result["adapter_id"]
        ) == [("prod",)]
    say(f"[smoke] e2e done in {time.monotonic() - start:.0f} s")
