"""smoke's checks as a JUnit report, for CI systems that show test results."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from servestack.smoke.summary import FAIL, NOT_RUN, Check


def render_junit(stack: str, checks: list[Check], wall_s: float = 0.0) -> str:
    """One <testcase> per check: not_run is <skipped message=...>, fail is <failure>."""
    failures = sum(1 for c in checks if c.status == FAIL)
    skipped = sum(1 for c in checks if c.status == NOT_RUN)
    suites = ET.Element("testsuites", name=f"servestack smoke {stack}", tests=str(len(checks)),
                        failures=str(failures), skipped=str(skipped), errors="0", time=f"{wall_s:.3f}")
    for probe in dict.fromkeys(c.probe for c in checks):
        mine = [c for c in checks if c.probe == probe]
        suite = ET.SubElement(
            suites, "testsuite", name=f"smoke.{stack}.{probe}", tests=str(len(mine)),
            failures=str(sum(1 for c in mine if c.status == FAIL)),
            skipped=str(sum(1 for c in mine if c.status == NOT_RUN)), errors="0",
            time=f"{sum(c.time_s or 0 for c in mine):.3f}",
        )
        for c in mine:
            case = ET.SubElement(suite, "testcase", classname=f"smoke.{stack}.{probe}", name=c.name,
                                 time=f"{c.time_s or 0:.3f}")
            if c.status == FAIL:
                failure = ET.SubElement(case, "failure", message=(c.detail.strip().splitlines() or [""])[0][:500], type="SmokeFailure")
                failure.text = c.detail
            elif c.status == NOT_RUN:
                ET.SubElement(case, "skipped", message=c.detail[:2000])
            elif c.detail:
                out = ET.SubElement(case, "system-out")
                out.text = c.detail
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
