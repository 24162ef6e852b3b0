"""A stand-in for an external judge model: an HTTP server on loopback speaking OpenAI's chat-completions wire shape.

It reads the answers out of AGL's judge prompt (`### Answer N` blocks), scores each by `score(answer)` and replies
with the JSON AGL's judge asks for, with `usage` token counts as a real endpoint gives them. Per task (found in the
prompt's text) it can misbehave instead: `fail_marker` in the task -> HTTP 503, `prose_marker` -> a reply in prose
with no JSON. Every request is kept (path, headers, body) for the tests to look at.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ANSWER = re.compile(r"### Answer (\d+)\n(.*?)(?=\n\n### Answer \d+\n|\n\nReply with the JSON object)", re.DOTALL)


@dataclass
class JudgeServer:
    score: Callable[[str], float] = lambda answer: 1.0 if "Paris" in answer else 0.0
    fail_marker: str = "judge-down"
    prose_marker: str = "judge-rambles"
    model: str = "stand-in-judge"
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        if self.fail_marker in prompt:
            return 503, {"error": {"message": "the judge is overloaded", "type": "server_error"}}
        if self.prose_marker in prompt:
            text = "All of these answers look reasonable to me."
        else:
            scores = [
                {"answer": int(number), "score": self.score(answer), "why": f"answer {number} judged by the rule"}
                for number, answer in _ANSWER.findall(prompt)
            ]
            text = "```json\n" + json.dumps({"scores": scores}) + "\n```"
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return 200, {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }


@contextmanager
def serve_judge(judge: JudgeServer | None = None) -> Iterator[JudgeServer]:
    judge = judge or JudgeServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            judge.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            if self.path.rstrip("/").endswith("/chat/completions"):
                status, payload = judge.reply(body)
            else:
                status, payload = 404, {"error": {"message": f"no route {self.path}"}}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    judge.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield judge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
