"""Agent sessions: model and tool steps decided at run time, journaled like plan steps.

One journal, one fold: a session is a run of kind ``"session"``, its steps are the
same events, and approvals and reconciliation work on it unchanged. See
``docs/sessions.md``. The HTTP gateway lives in ``effectlog.session.http`` (extra ``http``).
"""

from __future__ import annotations

from effectlog.session.agent import Agent
from effectlog.session.durable import Session
from effectlog.session.gateway import Gateway, ToolboxGateway
from effectlog.session.identity import fingerprint, provider_key, tool_call_hash
from effectlog.session.scripted import ScriptedModel, ToolCallReply, call, say
from effectlog.session.steps import (
    AgentStep,
    ApprovalStep,
    Decision,
    FinalStep,
    ModelStep,
    Policy,
    Reconciled,
    ToolCall,
    ToolStep,
    allow_all,
)
from effectlog.session.store import Checkpointer, JournalCheckpointer, SqliteCheckpointer, Timeline
from effectlog.session.tools import Toolbox, ToolInfo

__all__ = [
    "Agent",
    "AgentStep",
    "ApprovalStep",
    "Checkpointer",
    "Decision",
    "FinalStep",
    "Gateway",
    "JournalCheckpointer",
    "ModelStep",
    "Policy",
    "Reconciled",
    "ScriptedModel",
    "Session",
    "SqliteCheckpointer",
    "Timeline",
    "ToolCall",
    "ToolCallReply",
    "ToolInfo",
    "ToolStep",
    "Toolbox",
    "ToolboxGateway",
    "allow_all",
    "call",
    "fingerprint",
    "provider_key",
    "say",
    "tool_call_hash",
]
