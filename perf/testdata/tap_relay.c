/*
 * tap_relay: the smallest user-space TAP gateway, for perf/ping-bound.sh
 * (BenchmarkPingBound, perf/pingbound_test.go). It creates TAP NAME and
 * carries every frame it reads to the peer in one UDP datagram, and
 * every datagram it receives into the TAP: no fabric, no protocol, no
 * batching, no runtime. What it costs a cold ping is what any user-space
 * TAP gateway with the same wake-up scheme costs on this machine.
 *
 *   tap_relay MODE NAME LOCAL_IP PORT PEER_IP
 *
 * MODE block: two threads, each in a blocking read(2) (TAP to UDP, UDP to
 *             TAP): one wake-up per hop, the fewest any parked relay pays.
 * MODE spin:  one thread polling both fds with non-blocking reads,
 *             never parking: no wake-up at all, and a whole CPU held.
 *
 * A frame the TAP refuses (EIO while it is down, EINVAL) is dropped, as
 * a NIC would. It runs until killed; the kernel removes the TAP when it
 * exits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

enum { FRAME = 65536 };

static int tapfd, udpfd;

static void die(const char *what) {
	perror(what);
	exit(1);
}

/* tap_to_udp and udp_to_tap are the block mode's two threads. */
static void *tap_to_udp(void *arg) {
	static char buf[FRAME];
	(void)arg;
	for (;;) {
		ssize_t n = read(tapfd, buf, sizeof buf);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("read tap");
		}
		if (send(udpfd, buf, (size_t)n, 0) < 0 && errno != ECONNREFUSED)
			die("send");
	}
	return NULL;
}

static void *udp_to_tap(void *arg) {
	static char buf[FRAME];
	(void)arg;
	for (;;) {
		ssize_t n = recv(udpfd, buf, sizeof buf, 0);
		if (n < 0) {
			if (errno == EINTR || errno == ECONNREFUSED)
				continue;
			die("recv");
		}
		if (write(tapfd, buf, (size_t)n) < 0 && errno != EINVAL && errno != EIO)
			die("write tap");
	}
	return NULL;
}

static void spin(void) {
	static char buf[FRAME];
	fcntl(tapfd, F_SETFL, fcntl(tapfd, F_GETFL) | O_NONBLOCK);
	fcntl(udpfd, F_SETFL, fcntl(udpfd, F_GETFL) | O_NONBLOCK);
	for (;;) {
		ssize_t n = read(tapfd, buf, sizeof buf);
		if (n > 0 && send(udpfd, buf, (size_t)n, 0) < 0 && errno != ECONNREFUSED && errno != EAGAIN)
			die("send");
		n = recv(udpfd, buf, sizeof buf, 0);
		if (n > 0 && write(tapfd, buf, (size_t)n) < 0 && errno != EINVAL && errno != EIO)
			die("write tap");
	}
}

int main(int argc, char **argv) {
	if (argc != 6) {
		fprintf(stderr, "usage: tap_relay block|spin NAME LOCAL_IP PORT PEER_IP\n");
		return 2;
	}
	tapfd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
	if (tapfd < 0)
		die("/dev/net/tun");
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", argv[2]);
	if (ioctl(tapfd, TUNSETIFF, &ifr) < 0)
		die("TUNSETIFF");

	struct sockaddr_in local = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[4]))};
	struct sockaddr_in peer = local;
	if (inet_pton(AF_INET, argv[3], &local.sin_addr) != 1 || inet_pton(AF_INET, argv[5], &peer.sin_addr) != 1) {
		fprintf(stderr, "tap_relay: bad address\n");
		return 2;
	}
	udpfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (udpfd < 0)
		die("socket");
	if (bind(udpfd, (struct sockaddr *)&local, sizeof local) < 0)
		die("bind");
	if (connect(udpfd, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	printf("ready\n");
	fflush(stdout);

	if (strcmp(argv[1], "spin") == 0) {
		spin();
		return 0;
	}
	if (strcmp(argv[1], "block") != 0) {
		fprintf(stderr, "tap_relay: mode %s: want block or spin\n", argv[1]);
		return 2;
	}
	pthread_t t;
	if (pthread_create(&t, NULL, tap_to_udp, NULL) != 0)
		die("pthread_create");
	udp_to_tap(NULL);
	return 0;
}
