"""The dynamic batcher: a pure policy (when to flush, inline or in a thread), a pure
assembler (how to pack and split), and the asyncio mechanism that applies them to an
engine's execution slots (`queue.Batcher`: admission, scheduler, slot runner)."""
