"""The LitServe peer: a model folder's sentence embeddings behind LitServe, written as its
documentation shows a batched API.

    python -P litserve_app.py --model DIR --port PORT [--max-batch-size 16] [--batch-timeout 0.005]

- **LitServe's batching.** `LitAPI(max_batch_size=16, batch_timeout=0.005)`: LitServe collects
  up to 16 requests or waits 5 ms, calls `batch` with their decoded inputs, `predict` once, and
  `unbatch` to answer each request. A request carries a list of texts; the batch's texts are
  tokenized in one call, padded to the longest, and forwarded at once.
- **The gateway's embed task, fp32 torch.** `transformers.AutoModel` in float32, mean pooling
  over the attention mask and L2 normalisation, as serve.recipes.variants' `embed` computes it;
  torch threads: every core (as the plain Serve deployment, ops.bench.plain).
- **The gateway's body and answer.** `POST /predict` takes `{"inputs": [...], "task":
  "embed"}` and answers `{"outputs": [{"embedding": [...]}, ...]}`, values rounded to 6 places
  as the gateway's answer is, so both send the same bytes; `GET /health` answers `ok` once the
  worker is ready.

A script on its own (ops.bench.peers runs it with `-P`, so this folder's modules never shadow a
package): it imports nothing of the project.
"""

from __future__ import annotations

import argparse
import os

import litserve as ls
import torch
from transformers import AutoModel, AutoTokenizer


class Embedder(ls.LitAPI):
    """Sentence embeddings of batched requests (module docstring)."""

    def __init__(self, model_dir: str, **batching):
        super().__init__(**batching)
        self.model_dir = model_dir

    def setup(self, device: str) -> None:
        torch.set_num_threads(os.cpu_count() or 1)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModel.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    def decode_request(self, request: dict) -> list[str]:
        return request["inputs"]

    def batch(self, inputs: list[list[str]]) -> list[list[str]]:
        return inputs

    @torch.inference_mode()
    def predict(self, batch: list[list[str]]) -> list[list[list[float]]]:
        texts = [text for request in batch for text in request]
        encoded = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        hidden = self.model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        rows = torch.nn.functional.normalize(pooled, dim=-1).tolist()
        answers, start = [], 0
        for request in batch:
            answers.append(rows[start:start + len(request)])
            start += len(request)
        return answers

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: list[list[float]]) -> dict:
        return {"outputs": [{"embedding": [round(v, 6) for v in row]} for row in output]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="the model folder")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--batch-timeout", type=float, default=0.005, help="seconds")
    args = p.parse_args()
    api = Embedder(args.model, max_batch_size=args.max_batch_size,
                   batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False)


if __name__ == "__main__":
    main()
