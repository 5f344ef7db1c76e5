"""The registered routings as the messages list them, read from the registries, so a routing added by its one file
and one registry line leaves the tests' expected messages right (the shipped four are checked to be among them in
test_routing_registry)."""
from __future__ import annotations

import re

from capsnet.models import CapsNetConfig
from capsnet.models.segcaps import stack_routings
from capsnet.routing import list_routings

SHIPPED = ("dynamic", "em", "inverted", "self-attention")
ALL = re.escape(", ".join(list_routings()))  # every registered routing: regular expressions for pytest.raises(match=)
CAPSNET = re.escape(", ".join(CapsNetConfig.probability_routings()))  # those CapsNet's digit capsules take
STACK = re.escape(", ".join(stack_routings()))  # those every capsule layer of SegCaps and CapsPix2pix takes
STACK_TEXT = ", ".join(stack_routings())  # the same as plain text, for a substring check
