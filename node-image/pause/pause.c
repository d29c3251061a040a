/*
 * pause: the pod sandbox ("infra") container's process, built by the kilonode image
 * recipe so that a fresh node never needs a registry pull before its first pod.
 *
 * It holds the pod's namespaces open, reaps zombies (it is PID 1 of the pod's PID
 * namespace when the namespace is shared) and exits 0 on SIGTERM or SIGINT, so that
 * `docker stop` / a CRI StopPodSandbox ends it at once instead of waiting for SIGKILL.
 * Compiled with `gcc -static` at build time: the image holds nothing but this binary.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signo) {
	/* write(2) is async-signal-safe; printf is not. */
	static const char msg[] = "pause: stopping\n";
	(void)signo;
	(void)!write(STDERR_FILENO, msg, sizeof msg - 1);
	_exit(0);
}

static void on_child(int signo) {
	(void)signo;
	int saved = errno;
	/* Reap every exited child; several SIGCHLDs may have merged into one. */
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

static int install(int signo, void (*handler)(int), int flags) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	return sigaction(signo, &sa, NULL);
}

int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("pause (kilonode)");
		return 0;
	}
	if (getpid() != 1) {
		/* Not fatal: useful when run by hand, but say why zombies may not be ours. */
		fprintf(stderr, "pause: warning: not PID 1\n");
	}
	if (install(SIGTERM, on_stop, 0) < 0 || install(SIGINT, on_stop, 0) < 0 ||
	    install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
		perror("pause: sigaction");
		return 1;
	}
	for (;;) {
		pause();
	}
	return 42; /* unreachable */
}
