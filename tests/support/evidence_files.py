"""Evidence for the display tests: a claude transcript as the adapter writes it (with a long tool
output, a failed tool call and lines an agent could forge), kept for an execution through the
evidence API (files on this host, their sha256s in the store), as the engine keeps a run folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from apg_farm.store import Execution, Store
from apg_farm.store.evidence import Kept, KeptFile, local_host_label, record_kept

PROMPT = "Create a view listing every article, 10 a page, at /articles.\n"
SCRIPT3 = "<script>window.__xss=3</script>"
#: A transcript line an agent wrote by hand: not stream-json, with markup in it.
HOSTILE_LINE = f'</pre></div>{SCRIPT3}<img src=x onerror="window.__xss=4">'
LONG_LINES = 80
#: Markdown an agent may write: a viewer that renders it would fetch the image from elsewhere.
MARKDOWN = "![pixel](http://127.0.0.1:9/pixel.png) **bold**"


def transcript(run_id: str = "run-1") -> bytes:
    long_output = "\n".join(f"node/{i}  Article {i}  published" for i in range(LONG_LINES))
    docs: list[object] = [
        {
            "type": "system",
            "subtype": "init",
            "session_id": "sess-1",
            "model": "claude-sonnet-4-5",
            "cwd": "/var/www/html",
            "tools": ["Bash", "Read", "Edit"],
        },
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"I will list the articles first. {MARKDOWN}"},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "Bash",
                        "input": {"command": "drush sql:query 'SELECT nid FROM node'"},
                    },
                ],
                "usage": {"input_tokens": 120, "output_tokens": 30},
            },
        },
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [{"type": "text", "text": long_output}],
                        "is_error": False,
                    }
                ],
            },
        },
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_02",
                        "name": "Read",
                        "input": {"file_path": f"/var/www/html/runs/{run_id}/../old/grade.json"},
                    }
                ],
            },
        },
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_02",
                        "content": f"File does not exist. {SCRIPT3}",
                        "is_error": True,
                    }
                ],
            },
        },
        HOSTILE_LINE,
        {
            "type": "assistant",
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "The view is saved at /articles."}],
            },
        },
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "num_turns": 3,
            "duration_ms": 4200,
            "result": "The view is saved at /articles.",
            "total_cost_usd": 0.0123,
        },
    ]
    text = "\n".join(d if isinstance(d, str) else json.dumps(d) for d in docs) + "\n"
    return text.encode()


def run_folder(run_id: str) -> dict[str, bytes]:
    base = f"runs/{run_id}"
    return {
        f"{base}/prompt.txt": PROMPT.encode(),
        f"{base}/transcript.jsonl": transcript(run_id),
        f"{base}/run.json": json.dumps(
            {"run_id": run_id, "adapter": "claude", "status": "completed", "note": SCRIPT3}
        ).encode(),
        f"{base}/stderr.txt": b"adapter: done\n",
    }


def keep(store: Store, execution_id: int, folder: Path, files: dict[str, bytes]) -> None:
    """Write `files` under `folder` on this host and record them as the execution's evidence."""
    kept = []
    for path, data in sorted(files.items()):
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        kept.append(KeptFile(path, len(data), hashlib.sha256(data).hexdigest(), False))
    with store.session() as session:
        execution = session.get_one(Execution, execution_id)
        record_kept(session, execution, Kept(str(folder), local_host_label(), tuple(kept)))
