"""The report's harm table on hand-made result lines whose counts are worked out by hand.

Closed-book right and the system wrong is a loss (and the reverse a win), question by question;
for RIG, a draft before the first retrieval that held the gold answer and a final answer that
does not is a loss (and the reverse a gain), answer by answer. Lines with an error count nowhere.
"""

from __future__ import annotations

from rigkit.eval.report import report_tables

HARM = "Harm: answers retrieval made wrong (losses) or right (wins), on Cover EM"
HEADER = ["System", "Questions", "Closed-book right, system wrong", "System right, closed-book wrong",
          "Draft right, final wrong", "Draft wrong, final right", "Answers with a draft"]


def line(system: str, qid: str, cover: float | None, draft: float | None = None, error: str | None = None) -> dict:
    return {"id": qid, "type": "comparison", "system": system, "run": 0, "seed": 0, "cover_em": cover,
            "draft_cover_em": draft, "latency": 1.0, "retrievals": 1, "timings": {}, "error": error}


# Cover EM per question (draft before the first retrieval in brackets):
#              q1      q2       q3      q4      q5
# closed_book  1       1        0       0       1
# rag          1       0        1       0       0
# rig:prob     0 (1)   1 (none) 1 (0)   1 (1)   error
ROWS = [
    line("closed_book", "q1", 1.0), line("closed_book", "q2", 1.0), line("closed_book", "q3", 0.0),
    line("closed_book", "q4", 0.0), line("closed_book", "q5", 1.0),
    line("rag", "q1", 1.0), line("rag", "q2", 0.0), line("rag", "q3", 1.0), line("rag", "q4", 0.0),
    line("rag", "q5", 0.0),
    line("rig:prob", "q1", 0.0, draft=1.0),  # retrieval took a right answer away
    line("rig:prob", "q2", 1.0),  # never retrieved mid-answer: no draft to compare
    line("rig:prob", "q3", 1.0, draft=0.0),  # retrieval made it right
    line("rig:prob", "q4", 1.0, draft=1.0),  # right before and after
    line("rig:prob", "q5", None, draft=1.0, error="the server went away"),  # counted nowhere
]


def test_the_harm_table_counts_losses_and_wins_against_closed_book_and_the_draft():
    header, table = report_tables(ROWS)[HARM]
    assert header == HEADER
    # rag: closed-book right where rag is wrong on q2 and q5; rag right where closed-book is wrong on q3;
    # no line of rag has a draft
    # rig:prob (q5 left out): closed-book right, rig wrong on q1; rig right, closed-book wrong on q3 and
    # q4; draft right, final wrong on q1; draft wrong, final right on q3; drafts on q1, q3, q4
    assert table == [["rag", "5", "2", "1", "–", "–", "0"],
                     ["rig:prob", "4", "1", "2", "1", "1", "3"]]


def test_without_closed_book_the_first_counts_are_dashes_and_each_run_counts_its_drafts():
    rows = [r for r in ROWS if r["system"] == "rig:prob"]
    rows += [{**line("rig:prob", "q1", 1.0, draft=0.0), "run": 1}]  # a second run of q1: wrong draft, right answer
    header, table = report_tables(rows)[HARM]
    # the drafts count per answer: q1's two runs are one loss and one gain
    assert table == [["rig:prob", "4", "–", "–", "1", "2", "4"]]
