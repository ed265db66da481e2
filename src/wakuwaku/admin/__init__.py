"""Operations on a consumer group's dead letters and state: what ``wakuwaku dlq``
and ``wakuwaku status`` run (design §6, §8, §14).

One module per task; every name is importable from ``wakuwaku.admin``:

- :mod:`wakuwaku.admin.dead_letters`: :func:`list_dead_letters`,
  :func:`replay_dead_letters` and the replay ledger.
- :mod:`wakuwaku.admin.purge`: :func:`purge_dead_letters` (``wakuwaku dlq
  purge``), recorded in the same ledger, and :func:`purged_offsets`.
- :mod:`wakuwaku.admin.offsets`: :func:`reset_offsets` (``wakuwaku group
  reset-offsets``) and what it is built on (:func:`plan_offset_reset`,
  :func:`apply_offset_reset`, :func:`running_members`, :func:`offset_at_time`).
- :mod:`wakuwaku.admin.control`: :func:`pause`, :func:`resume`,
  :func:`pauses`, :func:`retry_key_now` and :func:`give_up_key` (``wakuwaku
  pause``, ``resume``, ``pauses``, ``key retry-now``, ``key give-up``):
  commands every consumer of the group reads.
- :mod:`wakuwaku.admin.status`: :func:`consumer_status` (lag, quarantined
  keys, retry backlog, dead letters per reason, pauses in force).
"""

from .control import ControlRecord as ControlRecord
from .control import KeyNotQuarantinedError as KeyNotQuarantinedError
from .control import give_up_key as give_up_key
from .control import operator_name as operator_name
from .control import pause as pause
from .control import pauses as pauses
from .control import read_commands as read_commands
from .control import resume as resume
from .control import retry_key_now as retry_key_now
from .dead_letters import MISSING_REASON as MISSING_REASON
from .dead_letters import DeadLetter as DeadLetter
from .dead_letters import DeadLetterOrder as DeadLetterOrder
from .dead_letters import ReplayedDeadLetter as ReplayedDeadLetter
from .dead_letters import ReplayReport as ReplayReport
from .dead_letters import SkippedDeadLetter as SkippedDeadLetter
from .dead_letters import dead_letter_groups as dead_letter_groups
from .dead_letters import derived_topic_owner as derived_topic_owner
from .dead_letters import list_dead_letters as list_dead_letters
from .dead_letters import main_topic_problem as main_topic_problem
from .dead_letters import parse_dead_letter as parse_dead_letter
from .dead_letters import replay_dead_letters as replay_dead_letters
from .dead_letters import replay_ledger_topic_name as replay_ledger_topic_name
from .dead_letters import resolve_group_topics as resolve_group_topics
from .offsets import OffsetResetPlan as OffsetResetPlan
from .offsets import PartitionReset as PartitionReset
from .offsets import ResetPosition as ResetPosition
from .offsets import ResetTarget as ResetTarget
from .offsets import RunningMember as RunningMember
from .offsets import apply_offset_reset as apply_offset_reset
from .offsets import committed_groups as committed_groups
from .offsets import offset_at_time as offset_at_time
from .offsets import plan_offset_reset as plan_offset_reset
from .offsets import reset_offsets as reset_offsets
from .offsets import running_members as running_members
from .purge import PurgeReport as PurgeReport
from .purge import purge_dead_letters as purge_dead_letters
from .purge import purged_offsets as purged_offsets
from .status import PartitionStatus as PartitionStatus
from .status import QuarantinedKey as QuarantinedKey
from .status import Status as Status
from .status import consumer_status as consumer_status

__all__ = (
    "MISSING_REASON",
    "ControlRecord",
    "DeadLetter",
    "DeadLetterOrder",
    "KeyNotQuarantinedError",
    "OffsetResetPlan",
    "PartitionReset",
    "PartitionStatus",
    "PurgeReport",
    "QuarantinedKey",
    "ReplayReport",
    "ReplayedDeadLetter",
    "ResetPosition",
    "ResetTarget",
    "RunningMember",
    "SkippedDeadLetter",
    "Status",
    "apply_offset_reset",
    "committed_groups",
    "consumer_status",
    "dead_letter_groups",
    "derived_topic_owner",
    "give_up_key",
    "list_dead_letters",
    "main_topic_problem",
    "offset_at_time",
    "operator_name",
    "parse_dead_letter",
    "pause",
    "pauses",
    "plan_offset_reset",
    "purge_dead_letters",
    "purged_offsets",
    "read_commands",
    "replay_dead_letters",
    "replay_ledger_topic_name",
    "reset_offsets",
    "resolve_group_topics",
    "resume",
    "retry_key_now",
    "running_members",
)
