/* examples/cli.h - what every example and bench do with standard output:
   output that could not be written fails the program. Results printed to a
   full disk (>/dev/full) or a closed stream are lost, so exiting 0 would
   report success for output nobody got. EX_CHECK_STDOUT(argv[0]) at the
   top of main registers a check that runs at exit: it flushes stdout and,
   on an error, says so on stderr and exits 1 (as GNU coreutils'
   close_stdout). C99 only (atexit, _Exit). (A flag given twice is no
   error in these programs: the last one counts, as in most Unix tools, so
   a script may append an override to a base command line.) */
#ifndef EX_CLI_H
#define EX_CLI_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *ex_stdout_prog = "program";

static void ex_stdout_check(void)
{
    int e;
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return;
    e = errno;
    fprintf(stderr, "%s: writing standard output: %s\n", ex_stdout_prog, e ? strerror(e) : "write error");
    _Exit(1);
}

#define EX_CHECK_STDOUT(prog) ((void)(ex_stdout_prog = (prog)), (void)atexit(ex_stdout_check))
#endif
