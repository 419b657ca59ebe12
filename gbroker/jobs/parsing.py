"""A job document's untrusted text parsed into a tree, every refusal a
:class:`~gbroker.jobs.description.JsdlError` naming the document and where: the size check
first, then XML through defusedxml, JSON, or YAML without anchors and aliases; and an XML
element's tag split into its namespace and local name."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import cast
from xml.parsers import expat

import defusedxml
import defusedxml.ElementTree as SafeET

from gbroker.errors import Shown
from gbroker.jobs.description import JsdlError

__all__ = ["check_size", "parse_json", "parse_xml", "parse_yaml", "split_tag"]


def split_tag(tag: str) -> tuple[str, str]:
    """An element's tag as (namespace, local name); no namespace is ""."""
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return "", tag


def check_size(data: bytes, document: str, max_bytes: int) -> None:
    """Refuse a document of more than ``max_bytes`` bytes, before anything reads it."""
    if len(data) > max_bytes:
        raise JsdlError(
            document,
            "document",
            f"at most {max_bytes} bytes (the job description size limit)",
            len(data),
        )


def parse_xml(data: str | bytes, document: str) -> ET.Element:
    """XML through defusedxml: a DTD, entity or external reference is refused (no billion
    laughs, no XXE), and so is XML that is not well-formed, naming its line and column."""
    try:
        root = SafeET.fromstring(data, forbid_dtd=True)
    except ET.ParseError as exc:
        line, column = exc.position
        reason = expat.ErrorString(exc.code) if isinstance(exc.code, int) else str(exc)
        if reason == "unbound prefix":
            text = data if isinstance(data, str) else data.decode("utf-8", "replace")
            source = text.splitlines()
            if 0 < line <= len(source):
                m = re.match(r"</?([\w.-]+):", source[line - 1][column:])
                if m:
                    reason = f"unbound prefix {m.group(1)} (no xmlns:{m.group(1)} in scope)"
        raise JsdlError(
            document, f"line {line}, column {column + 1}", "well-formed XML", reason
        ) from None
    except defusedxml.DefusedXmlException as exc:
        raise JsdlError(
            document,
            "document",
            "XML without a DTD, entity declarations or external references",
            type(exc).__name__,
        ) from None
    return cast(ET.Element, root)


def parse_json(text: str, document: str) -> object:
    """JSON, well-formed, not nested too deeply, its numbers of at most 4300 digits."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsdlError(
            document, f"line {exc.lineno}, column {exc.colno}", "well-formed JSON", exc.msg
        ) from None
    except RecursionError:
        raise JsdlError(document, "document", "JSON nested less deeply", "too deep") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise JsdlError(document, "document", "numbers of at most 4300 digits", str(exc)) from None


def parse_yaml(text: str, document: str) -> object:
    """YAML without anchors or aliases (:mod:`gbroker.untrusted.safeyaml`), well-formed."""
    import yaml

    from gbroker.untrusted import safeyaml

    try:
        return safeyaml.load(text)
    except safeyaml.AliasRefused as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        raise JsdlError(
            document, where, "YAML without anchors or aliases", Shown(exc.problem or "")
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        raise JsdlError(document, where, "well-formed YAML", exc.problem or str(exc)) from None
    except yaml.YAMLError as exc:
        raise JsdlError(document, "document", "well-formed YAML", str(exc)) from None
    except RecursionError:
        raise JsdlError(document, "document", "YAML nested less deeply", "too deep") from None
