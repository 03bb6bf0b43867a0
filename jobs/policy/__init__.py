from thicket.policy.base import Messages, Policy, Reply

__all__ = ["Messages", "Policy", "Reply"]
