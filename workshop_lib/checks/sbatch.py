"""What a job script asks SLURM for: its #SBATCH directives, read the way sbatch reads them.

sbatch reads `#SBATCH` lines from the top of the script until the first command; on each line an
unquoted `#` starts a comment (so a second `#SBATCH` glued onto a line is silently dropped). Only a line
that starts with exactly `#SBATCH` is a directive: an indented `  #SBATCH`, `# SBATCH` or `#sbatch` is a
comment to sbatch (seen on slurm-wlm 22.05: tests/checks/test_lint_on_cluster.py).
Options are sbatch's long options (`--nodes=2`, `--nodes 2`) or their one-letter forms (`-N 2`,
`-N2`); the command line's options win over the script's. The linter, the job layer and the local
executor all read scripts through this module."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = "#SBATCH"
# sbatch's one-letter options that take a value, by their long names.
SHORT_OPTIONS = {"A": "account", "a": "array", "B": "extra-node-info", "b": "begin", "c": "cpus-per-task",
                 "C": "constraint", "F": "nodefile",
                 "D": "chdir", "d": "dependency", "e": "error", "G": "gpus", "i": "input", "J": "job-name",
                 "L": "licenses", "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks",
                 "o": "output", "p": "partition", "q": "qos", "S": "core-spec", "t": "time", "w": "nodelist",
                 "x": "exclude"}
# One-letter and long options that take no value (or only with `=`): they never swallow the next word.
SHORT_FLAGS = {"H": "hold", "I": "immediate", "k": "no-kill", "O": "overcommit", "Q": "quiet",
               "s": "oversubscribe", "v": "verbose", "W": "wait"}
LONG_FLAGS = {"exclusive", "requeue", "no-requeue", "hold", "overcommit", "oversubscribe", "contiguous",
              "spread-job", "test-only", "parsable", "quiet", "verbose", "wait", "use-min-nodes", "ignore-pbs",
              "no-kill", "immediate", "get-user-env", "export-file"}
ALIASES = {"tasks-per-node": "ntasks-per-node"}


@dataclass(frozen=True)
class Directive:
    """One option of an #SBATCH line (or of the command line, with line None)."""

    option: str  # the long name, e.g. "ntasks-per-node"
    value: str
    line: int | None = None


@dataclass(frozen=True)
class SbatchHeader:
    """The directives of a script as sbatch reads them, and what it silently skips."""

    directives: tuple[Directive, ...] = ()
    first_command_line: int | None = None
    after_command_lines: tuple[int, ...] = ()  # #SBATCH lines past the first command: ignored
    glued_lines: tuple[int, ...] = ()  # lines whose second #SBATCH became a comment
    look_alike_lines: tuple[int, ...] = ()  # comments that look like a directive (`  #SBATCH`, `# SBATCH`)
    stray_words: tuple[tuple[int, str], ...] = ()  # (line, word): a word of a directive that is no option

    def get(self, option: str) -> str | None:
        """The value sbatch uses (the last one given), or None."""
        found = self._last(option)
        return found.value if found else None

    def line(self, option: str) -> int | None:
        found = self._last(option)
        return found.line if found else None

    def on_line(self, line: int) -> list[Directive]:
        return [directive for directive in self.directives if directive.line == line]

    def with_command_line(self, args: Sequence[str]) -> "SbatchHeader":
        """The request once sbatch's own arguments (which win) are added."""
        extra = tuple(Directive(name, value) for name, value in parse_options(list(args)))
        return SbatchHeader(self.directives + extra, self.first_command_line, self.after_command_lines,
                            self.glued_lines, self.look_alike_lines, self.stray_words)

    @property
    def gpus_per_node(self) -> int:
        """GPUs asked for on each node, from --gpus-per-node, --gres=gpu[:type]:N or --gpus (0: none)."""
        for option in ("gpus-per-node", "gres", "gpus"):
            value = self.get(option)
            if value:
                match = re.search(r"(\d+)$", value.split(",")[0])
                return int(match.group(1)) if match else 1
        return 0

    @property
    def gpu_type(self) -> str | None:
        """The GPU model a typed request names (`--gres=gpu:a100:4`, `--gpus=a100:4`), lower case, or None."""
        for option in ("gres", "gpus", "gpus-per-node", "gpus-per-task"):
            parts = (self.get(option) or "").split(",")[0].lower().split(":")
            if option == "gres" and parts[0] != "gpu":
                continue
            typed = parts[1:-1] if option == "gres" else parts[:-1]
            if typed and typed[0] and not typed[0].isdigit():
                return typed[0]
        return None

    def _last(self, option: str) -> Directive | None:
        return next((d for d in reversed(self.directives) if d.option == option), None)


def parse_options(tokens: list[str], strays: list[str] | None = None) -> list[tuple[str, str]]:
    """(long name, value) for each option in sbatch's argument words; words that are neither an option nor its
    value go to ``strays`` (in an #SBATCH line sbatch refuses them: 'Invalid directive found in batch script')."""
    options = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("--"):
            name, equals, value = token[2:].partition("=")
            if not equals and name not in LONG_FLAGS and index + 1 < len(tokens) \
                    and not tokens[index + 1].startswith("-"):
                value, index = tokens[index + 1], index + 1
            options.append((ALIASES.get(name, name), value))
        elif token.startswith("-") and len(token) >= 2 and token[1] in SHORT_OPTIONS:
            value = token[2:].lstrip("=")
            if not value and index + 1 < len(tokens):
                value, index = tokens[index + 1], index + 1
            options.append((SHORT_OPTIONS[token[1]], value))
        elif token.startswith("-") and len(token) == 2 and token[1] in SHORT_FLAGS:
            options.append((SHORT_FLAGS[token[1]], ""))
        elif strays is not None and not token.startswith("-"):
            strays.append(token)
        index += 1
    return options


# shlex reads character by character: a line past LONGEST_LINE (data, not a command a person wrote) is split on
# blanks only, so that checking a script stays linear in its size.
LONGEST_LINE = 16 * 2**10


def shell_words(line: str) -> list[str]:
    """The words of one shell line as the shell splits them (quotes group); a line with a quote left open, or
    one longer than LONGEST_LINE, by blanks."""
    if len(line) > LONGEST_LINE:
        return line.split()
    try:
        return shlex.split(line)
    except ValueError:  # a quote left open (a string going on past this line): its plain words
        return line.split()


def _words(body: str) -> list[str]:
    """sbatch's words of one directive line: quotes group, an unquoted `#` ends the line."""
    if len(body) > LONGEST_LINE:
        return body.split("#", 1)[0].split()
    lexer = shlex.shlex(body, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: sbatch takes the rest of the line as it is
        return body.split("#", 1)[0].split()


# `cat > job.sbatch <<'EOF'`: the lines up to the delimiter are data (often a second job script), not code.
HEREDOC = re.compile(r"(?<!<)<<-?(?!<)\s*(['\"]?)([A-Za-z_]\w*)\1")  # not a here-string (<<<)


def heredoc_lines(text: str) -> set[int]:
    """The line numbers (from 1) of every heredoc body, delimiters excluded."""
    inside: set[int] = set()
    delimiters: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if delimiters:
            if line.strip() == delimiters[0]:
                delimiters.pop(0)
            else:
                inside.add(number)
            continue
        if not line.lstrip().startswith("#"):
            delimiters = [match.group(2) for match in HEREDOC.finditer(line)]
    return inside


# What people mean as a directive but sbatch reads as a comment: indented, a space after `#`, another case.
# `##SBATCH` is the usual way to switch one off, and is left alone.
_LOOK_ALIKE = re.compile(r"^(?:\s+#\s*SBATCH|#\s+SBATCH|#(?!SBATCH)[Ss][Bb][Aa][Tt][Cc][Hh])\b")


def read_header(text: str) -> SbatchHeader:
    """The #SBATCH directives of a script (those before its first command). `#SBATCH` text inside a
    heredoc (a job script the script writes) is data, never a directive of this one."""
    directives: list[Directive] = []
    after_command: list[int] = []
    glued: list[int] = []
    look_alikes: list[int] = []
    strays: list[tuple[int, str]] = []
    first_command: int | None = None
    in_heredoc = heredoc_lines(text)
    for number, line in enumerate(text.splitlines(), start=1):
        if number in in_heredoc:
            continue
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if not line.startswith(MAGIC) and _LOOK_ALIKE.match(line):
            if first_command is None:
                look_alikes.append(number)
            continue
        if line.startswith(MAGIC):
            if first_command is not None:
                after_command.append(number)
                continue
            body = stripped[len(MAGIC):]
            if MAGIC in body:
                glued.append(number)
            words: list[str] = []
            directives += [Directive(name, value, number) for name, value in parse_options(_words(body), words)]
            strays += [(number, word) for word in words]
        elif stripped and not stripped.startswith("#") and first_command is None:
            first_command = number
    return SbatchHeader(tuple(directives), first_command, tuple(after_command), tuple(glued), tuple(look_alikes),
                        tuple(strays))


def sbatch_request(text: str, command_line: Sequence[str] = ()) -> SbatchHeader:
    """What a submission asks for: the script's directives, then sbatch's own arguments."""
    return read_header(text).with_command_line(command_line)
