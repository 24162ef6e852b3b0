"""The scores the judge already gave, by cache key (scoring.cache_key: rubric, task, answer, judge model).

Guarantee: an answer scored once is never sent to the judge again for the same rubric, task and judge model, within
the run and, when the cache has a file, across restarts of the trainer: the file is appended (one JSON line per
score) before the score is used, and read back at start; a line torn by a crash is skipped (its answer is judged
again).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from services.trainer.judge.scoring import Score

log = logging.getLogger(__name__)


class ScoreCache:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._scores: dict[str, Score] = {}
        if path is not None and path.is_file():
            skipped = 0
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                    self._scores[str(record["key"])] = Score(float(record["score"]), str(record.get("why", "")))
                except (ValueError, KeyError, TypeError):
                    skipped += 1
            if skipped:
                log.warning("judge cache %s: %d unreadable line(s) skipped (judged again if met)", path, skipped)

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: str) -> Score | None:
        return self._scores.get(key)

    def put(self, scores: dict[str, Score]) -> None:
        """Remembers the scores, on disk first when the cache has a file."""
        new = {key: score for key, score in scores.items() if key not in self._scores}
        if not new:
            return
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lines = "".join(
                json.dumps({"key": key, "score": s.value, "why": s.why}, ensure_ascii=False) + "\n"
                for key, s in new.items()
            )
            with self.path.open("a", encoding="utf-8") as out:
                out.write(lines)
                out.flush()
        self._scores.update(new)
