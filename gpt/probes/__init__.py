"""Capability probes: small synthetic tasks (associative recall, copying, retrieval, memorisation) on which each
attention design trains from scratch, scored by accuracy on the answer positions, over seeds (scripts/probe.py)."""
