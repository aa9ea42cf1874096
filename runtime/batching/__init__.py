"""The dynamic batcher: a pure policy (when to flush), a pure assembler (how to pack and
split) and the asyncio queue that applies them to an engine's execution slots."""
