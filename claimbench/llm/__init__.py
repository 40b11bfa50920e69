"""The LLM substrate every LLM paper's suite shares: the compact Llama and its hook points
(`model`), SmolLM2-135M from its GGUF file (`smollm`) and the one evaluation loop
(`evaluate`: prefill, decode, teacher-forced NLL, task accuracy with per-item outcomes)."""
