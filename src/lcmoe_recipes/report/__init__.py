"""Views of plans for people and tools: text summaries and decision tables (:mod:`.text`), every decision and finding
explained as text or JSON (:mod:`.explain`), targets side by side (:mod:`.compare`), and PNG plots (:mod:`.plots`).
Nothing here imports torch or megatron."""
