"""Durability for agents written with other frameworks, built on their public interfaces.

Each integration lives in its own module and needs its own extra; importing this
package imports none of them:

- ``effectlog.integrations.pydantic_ai`` (extra ``pydantic-ai``): ``DurableAgent`` wraps a
  pydantic-ai ``Agent`` so each model request and each tool call is a journaled session step
  (``pydantic_ai_decisions``: the app's answers to held calls, written to the journal).
- ``effectlog.integrations.openai_agents`` (extra ``openai-agents``): ``DurableRunner.run`` is the
  Agents SDK's ``Runner.run`` with each model response and ``function_tool`` call a journaled
  session step (``openai_agents_decisions``: approvals given through the SDK's ``RunState``).
- ``framework_steps``: what both share (the pass's gateway, the tool's key, replayed outcomes).
"""

from __future__ import annotations
