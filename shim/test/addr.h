/*
 * addr.h: address helpers shared by the shim's C test programs
 * (shimtest.c, directcalls.c), as static inline functions so that each
 * program still builds from its one .c file.
 */
#ifndef EXN_SHIM_TEST_ADDR_H
#define EXN_SHIM_TEST_ADDR_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>

/* "IP:PORT" of the address at addr (a struct sockaddr of any kind) if it is
 * AF_INET or AF_INET6; "?:0" for another family. */
static inline void addr_str(const void *addr, char *buf, size_t n)
{
	const struct sockaddr *sa = addr;
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
		port = ntohs(a->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa;
		inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
		port = ntohs(a->sin6_port);
	}
	snprintf(buf, n, "%s:%d", ip, port);
}

#endif
