"""What the memory is, not only where: object kinds, recorded with ``alloctrace run --objects``.

    alloctrace run -q --objects -o kinds.snap examples/kinds.py
    alloctrace stats kinds.snap --key type --limit 5
    alloctrace stats kinds.snap --key lineno+type --limit 4

Each session keeps a history of page names: the line that builds it holds strings, the list
objects and their item arrays, which ``--key lineno+type`` tells apart.
"""


class Session:
    def __init__(self, user, pages):
        self.user = user
        self.history = [f"page-{user}-{i}" for i in range(pages)]


def main():
    sessions = [Session(user, 20) for user in range(3000)]
    total = sum(len(session.history) for session in sessions)
    print(f"{len(sessions)} sessions, {total} pages")
    return sessions


if __name__ == "__main__":
    kept = main()
