// SPDX-License-Identifier: Apache-2.0
// svc-compile's socket load balancer: the part of Cilium's socket LB (bpf_sock.c) that
// serves the service maps `svc-compile --target ebpf` writes (lb4 and lb6). Written for
// svc-compile from the map layouts in Cilium's bpf/lib/lb.h; not Cilium's code.
//
// Hooks (cgroup v2, attached to one cgroup), each for IPv4 (…4) and IPv6 (…6):
//   connect      translate service address → backend (TCP: random slot, UDP: by socket
//                cookie), record the reverse mapping; no backend → EHOSTUNREACH
//   sendmsg      the same for unconnected UDP
//   recvmsg      backend → service address on the source of received datagrams
//   getpeername  backend → service address for the peer of a translated socket
//
// Build (libbpf-dev headers; Debian keeps asm/ under the multiarch directory):
//   clang -O2 -g -target bpf -I/usr/include/$(cc -dumpmachine) -c sock_lb.c -o sock_lb.o

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define EHOSTUNREACH 113

#define LB_MAP_MAX 65536
#define SCOPE_EXT 0
#define SCOPE_INT 1
#define SVC_FLAG_AFFINITY (1 << 4)
#define SVC_FLAG2_TWO_SCOPES (1 << 5)
#define AFFINITY_TIMEOUT_MASK 0x00ffffff
#define NSEC_PER_SEC 1000000000ULL

#define SYS_REJECT 0
#define SYS_PROCEED 1

struct lb4_key {
	__be32 address;
	__be16 dport;
	__u16 backend_slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

struct lb4_service {
	union {
		__u32 backend_id;
		__u32 affinity_timeout;
		__u32 l7_lb_proxy_port;
	};
	__u16 count;
	__u16 rev_nat_index; /* network order */
	__u8 flags;
	__u8 flags2;
	__u16 qcount;
};

struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 flags;
	__u16 cluster_id;
	__u8 zone;
	__u8 pad;
};

struct lb4_reverse_nat {
	__be32 address;
	__be16 port;
} __attribute__((packed));

struct lb4_affinity_key {
	__u64 client_id; /* netns cookie */
	__u16 rev_nat_id;
	__u8 netns_cookie : 1, reserved : 7;
	__u8 pad1;
	__u32 pad2;
} __attribute__((packed));

struct lb_affinity_val {
	__u64 last_used; /* seconds, monotonic */
	__u32 backend_id;
	__u32 pad;
};

struct lb_affinity_match {
	__u32 backend_id;
	__u16 rev_nat_id;
	__u16 pad;
};

struct lb4_src_range_key {
	__u32 prefixlen;
	__u16 rev_nat_id;
	__u16 pad;
	__u32 addr;
};

struct ipv4_revnat_tuple {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct ipv4_revnat_entry {
	__be32 address;
	__be16 port;
	__u16 rev_nat_index;
};

/* Pinned by name: a loader that pins (or a bpftool batch file that created) the maps
 * under the same directory shares them with this program. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_services_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_backends_v3 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_reverse_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_affinity_match);
	__type(value, __u8);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb_affinity_match SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_src_range_key);
	__type(value, __u8);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_source_range SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv4_revnat_tuple);
	__type(value, struct ipv4_revnat_entry);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_reverse_sk SEC(".maps");

union v6addr {
	__u8 addr[16];
	__u32 p[4];
};

struct lb6_key {
	union v6addr address;
	__be16 dport;
	__u16 backend_slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

struct lb6_backend {
	union v6addr address;
	__be16 port;
	__u8 proto;
	__u8 flags;
	__u16 cluster_id;
	__u8 zone;
	__u8 pad;
};

struct lb6_reverse_nat {
	union v6addr address;
	__be16 port;
} __attribute__((packed));

struct lb6_affinity_key {
	union v6addr client_id; /* netns cookie in the first 8 bytes */
	__u16 rev_nat_id;
	__u8 netns_cookie : 1, reserved : 7;
	__u8 pad1;
	__u32 pad2;
} __attribute__((packed));

struct lb6_src_range_key {
	__u32 prefixlen;
	__u16 rev_nat_id;
	__u16 pad;
	union v6addr addr;
};

struct ipv6_revnat_tuple {
	__u64 cookie;
	union v6addr address;
	__be16 port;
	__u16 pad;
} __attribute__((packed));

struct ipv6_revnat_entry {
	union v6addr address;
	__be16 port;
	__u16 rev_nat_index;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb6_key);
	__type(value, struct lb4_service); /* lb6_service has the same layout */
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb6_services_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb6_backend);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb6_backends_v3 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, struct lb6_reverse_nat);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb6_reverse_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb6_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb6_src_range_key);
	__type(value, __u8);
	__uint(max_entries, LB_MAP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb6_source_range SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv6_revnat_tuple);
	__type(value, struct ipv6_revnat_entry);
	__uint(max_entries, LB_MAP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb6_reverse_sk SEC(".maps");

/* Slot 0 of the address; for a two-scope service the internal scope's entry, since a
 * socket is always in-cluster traffic (Cilium's scope switch). A wildcard entry (port 0,
 * protocol 0: "this address is a service's") is never found: the key has the socket's
 * port and protocol, and Cilium's lookup with the scope switch does not fall back to it
 * either (only the per-packet datapath, which drops on it, does). */
static __always_inline struct lb4_service *lookup_service(struct lb4_key *key)
{
	struct lb4_service *svc;

	key->scope = SCOPE_EXT;
	key->backend_slot = 0;
	svc = bpf_map_lookup_elem(&cilium_lb4_services_v2, key);
	if (svc && (svc->flags2 & SVC_FLAG2_TWO_SCOPES)) {
		key->scope = SCOPE_INT;
		svc = bpf_map_lookup_elem(&cilium_lb4_services_v2, key);
	}
	return svc;
}

/* The node's own network namespace, where a loopback address reaches node ports (the
 * loader sets it; 0 means the initial namespace). */
volatile const __u64 host_netns_cookie = 0;

static __always_inline int in_host_netns(struct bpf_sock_addr *ctx)
{
	__u64 host = host_netns_cookie ? host_netns_cookie : bpf_get_netns_cookie(0);

	return bpf_get_netns_cookie(ctx) == host;
}

/* A service at this address, or else, for a loopback address in the node's namespace,
 * the node-port surrogate (address 0) of the port. Cilium also takes the node's other
 * addresses here; svc-compile writes every node address as its own frontend instead.
 * Only node ports have surrogate entries, so no port-range check is needed. */
static __always_inline struct lb4_service *lookup_or_surrogate(struct bpf_sock_addr *ctx,
								struct lb4_key *key)
{
	struct lb4_service *svc = lookup_service(key);

	if (svc || (bpf_ntohl(key->address) >> 24) != 127 || !in_host_netns(ctx))
		return svc;
	key->address = 0;
	return lookup_service(key);
}

static __always_inline __u64 now_sec(void)
{
	return bpf_ktime_get_ns() / NSEC_PER_SEC;
}

/* The backend this network namespace was pinned to, if the pin has not expired and the
 * backend still serves the service (affinity_match); 0 otherwise. `affinity` is the
 * family's affinity map, `akey` its key (inlined: the verifier sees the map itself). */
static __always_inline __u32 affinity_backend(void *affinity, const struct lb4_service *svc,
					       const void *akey)
{
	struct lb_affinity_val *val = bpf_map_lookup_elem(affinity, akey);
	struct lb_affinity_match match = {};
	__u64 now = now_sec();

	if (!val)
		return 0;
	if (val->last_used + (svc->affinity_timeout & AFFINITY_TIMEOUT_MASK) <= now) {
		bpf_map_delete_elem(affinity, akey);
		return 0;
	}
	match.backend_id = val->backend_id;
	match.rev_nat_id = svc->rev_nat_index;
	if (!bpf_map_lookup_elem(&cilium_lb_affinity_match, &match))
		return 0;
	val->last_used = now;
	return val->backend_id;
}

/* Pins the namespace to the backend just chosen. */
static __always_inline void affinity_pin(void *affinity, const void *akey, __u32 backend_id)
{
	struct lb_affinity_val aval = {
		.last_used = now_sec(),
		.backend_id = backend_id,
	};

	bpf_map_update_elem(affinity, akey, &aval, BPF_ANY);
}

/* The slot a new connection takes: TCP at random, UDP by socket so that one socket's
 * datagrams stay on one backend. Slots 1..count hold the active backends (with none,
 * the serving terminating ones); the tail qcount counts behind them (terminating,
 * terminating-not-serving) keeps its connections but is never picked. */
static __always_inline __u16 pick_slot(struct bpf_sock_addr *ctx, const struct lb4_service *svc)
{
	__u32 r = ctx->protocol == IPPROTO_TCP ? bpf_get_prandom_u32()
					       : (__u32)bpf_get_socket_cookie(ctx);

	return (r % svc->count) + 1;
}

static __always_inline int xlate_fwd(struct bpf_sock_addr *ctx)
{
	struct lb4_key key = {}, orig;
	struct lb4_service *svc, *slot_svc;
	struct lb4_backend *backend = 0;
	struct lb4_affinity_key akey = {};
	struct ipv4_revnat_tuple rkey = {};
	struct ipv4_revnat_entry rval = {};
	__u32 backend_id = 0;
	int affinity;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 0;
	key.address = ctx->user_ip4;
	key.dport = (__be16)ctx->user_port;
	key.proto = ctx->protocol;
	orig = key;
	svc = lookup_or_surrogate(ctx, &key);
	if (!svc)
		return 0; /* not a service: leave the socket alone */
	if (svc->count == 0)
		return -EHOSTUNREACH;

	affinity = svc->flags & SVC_FLAG_AFFINITY;
	if (affinity) {
		akey.client_id = bpf_get_netns_cookie(ctx);
		akey.rev_nat_id = svc->rev_nat_index;
		akey.netns_cookie = 1;
		backend_id = affinity_backend(&cilium_lb4_affinity, svc, &akey);
		if (backend_id)
			backend = bpf_map_lookup_elem(&cilium_lb4_backends_v3, &backend_id);
	}
	if (!backend) {
		key.backend_slot = pick_slot(ctx, svc);
		slot_svc = bpf_map_lookup_elem(&cilium_lb4_services_v2, &key);
		if (!slot_svc)
			return -EHOSTUNREACH;
		backend_id = slot_svc->backend_id;
		backend = bpf_map_lookup_elem(&cilium_lb4_backends_v3, &backend_id);
		if (!backend)
			return -EHOSTUNREACH;
		if (affinity)
			affinity_pin(&cilium_lb4_affinity, &akey, backend_id);
	}

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = backend->address;
	rkey.port = backend->port;
	rval.address = orig.address;
	rval.port = orig.dport;
	rval.rev_nat_index = svc->rev_nat_index;
	if (bpf_map_update_elem(&cilium_lb4_reverse_sk, &rkey, &rval, BPF_ANY) < 0)
		return -EHOSTUNREACH;

	ctx->user_ip4 = backend->address;
	ctx->user_port = (__u32)backend->port;
	return 0;
}

/* Backend → service address, if this socket was translated to this backend and the
 * service still has that rev-NAT id and a backend to count (else the record is stale
 * and dropped, as Cilium's __sock4_xlate_rev does). A backend that turned terminating
 * keeps its translation: the service still counts an active one (or it). */
static __always_inline void xlate_rev(struct bpf_sock_addr *ctx)
{
	struct ipv4_revnat_tuple rkey = {};
	struct ipv4_revnat_entry *rval;
	struct lb4_key key = {};
	struct lb4_service *svc;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&cilium_lb4_reverse_sk, &rkey);
	if (!rval)
		return;
	key.address = rval->address;
	key.dport = rval->port;
	key.proto = ctx->protocol;
	svc = lookup_or_surrogate(ctx, &key);
	if (!svc || svc->rev_nat_index != rval->rev_nat_index || svc->count == 0) {
		bpf_map_delete_elem(&cilium_lb4_reverse_sk, &rkey);
		return;
	}
	ctx->user_ip4 = rval->address;
	ctx->user_port = (__u32)rval->port;
}

/* IPv6: the same steps over the lb6 maps. IPv4-mapped destinations on IPv6 sockets
 * are not translated. */
static __always_inline struct lb4_service *lookup_service6(struct lb6_key *key)
{
	struct lb4_service *svc;

	key->scope = SCOPE_EXT;
	key->backend_slot = 0;
	svc = bpf_map_lookup_elem(&cilium_lb6_services_v2, key);
	if (svc && (svc->flags2 & SVC_FLAG2_TWO_SCOPES)) {
		key->scope = SCOPE_INT;
		svc = bpf_map_lookup_elem(&cilium_lb6_services_v2, key);
	}
	return svc;
}

static __always_inline int is_v6_loopback(const union v6addr *a)
{
	return !a->p[0] && !a->p[1] && !a->p[2] && a->p[3] == bpf_htonl(1);
}

static __always_inline struct lb4_service *lookup_or_surrogate6(struct bpf_sock_addr *ctx,
								 struct lb6_key *key)
{
	struct lb4_service *svc = lookup_service6(key);

	if (svc || !is_v6_loopback(&key->address) || !in_host_netns(ctx))
		return svc;
	__builtin_memset(&key->address, 0, sizeof(key->address));
	return lookup_service6(key);
}

static __always_inline void ctx_get_ip6(const struct bpf_sock_addr *ctx, union v6addr *a)
{
	a->p[0] = ctx->user_ip6[0];
	a->p[1] = ctx->user_ip6[1];
	a->p[2] = ctx->user_ip6[2];
	a->p[3] = ctx->user_ip6[3];
}

static __always_inline void ctx_set_ip6(struct bpf_sock_addr *ctx, const union v6addr *a)
{
	ctx->user_ip6[0] = a->p[0];
	ctx->user_ip6[1] = a->p[1];
	ctx->user_ip6[2] = a->p[2];
	ctx->user_ip6[3] = a->p[3];
}

static __always_inline int xlate_fwd6(struct bpf_sock_addr *ctx)
{
	struct lb6_key key = {}, orig;
	struct lb4_service *svc, *slot_svc;
	struct lb6_backend *backend = 0;
	struct lb6_affinity_key akey = {};
	struct ipv6_revnat_tuple rkey = {};
	struct ipv6_revnat_entry rval = {};
	__u32 backend_id = 0;
	int affinity;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 0;
	ctx_get_ip6(ctx, &key.address);
	key.dport = (__be16)ctx->user_port;
	key.proto = ctx->protocol;
	orig = key;
	svc = lookup_or_surrogate6(ctx, &key);
	if (!svc)
		return 0;
	if (svc->count == 0)
		return -EHOSTUNREACH;

	affinity = svc->flags & SVC_FLAG_AFFINITY;
	if (affinity) {
		__u64 cookie = bpf_get_netns_cookie(ctx);

		__builtin_memcpy(akey.client_id.addr, &cookie, sizeof(cookie));
		akey.rev_nat_id = svc->rev_nat_index;
		akey.netns_cookie = 1;
		backend_id = affinity_backend(&cilium_lb6_affinity, svc, &akey);
		if (backend_id)
			backend = bpf_map_lookup_elem(&cilium_lb6_backends_v3, &backend_id);
	}
	if (!backend) {
		key.backend_slot = pick_slot(ctx, svc);
		slot_svc = bpf_map_lookup_elem(&cilium_lb6_services_v2, &key);
		if (!slot_svc)
			return -EHOSTUNREACH;
		backend_id = slot_svc->backend_id;
		backend = bpf_map_lookup_elem(&cilium_lb6_backends_v3, &backend_id);
		if (!backend)
			return -EHOSTUNREACH;
		if (affinity)
			affinity_pin(&cilium_lb6_affinity, &akey, backend_id);
	}

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = backend->address;
	rkey.port = backend->port;
	rval.address = orig.address;
	rval.port = orig.dport;
	rval.rev_nat_index = svc->rev_nat_index;
	if (bpf_map_update_elem(&cilium_lb6_reverse_sk, &rkey, &rval, BPF_ANY) < 0)
		return -EHOSTUNREACH;

	ctx_set_ip6(ctx, &backend->address);
	ctx->user_port = (__u32)backend->port;
	return 0;
}

static __always_inline void xlate_rev6(struct bpf_sock_addr *ctx)
{
	struct ipv6_revnat_tuple rkey = {};
	struct ipv6_revnat_entry *rval;
	struct lb6_key key = {};
	struct lb4_service *svc;
	union v6addr peer;

	ctx_get_ip6(ctx, &peer);
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = peer;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&cilium_lb6_reverse_sk, &rkey);
	if (!rval)
		return;
	key.address = rval->address;
	key.dport = rval->port;
	key.proto = ctx->protocol;
	svc = lookup_or_surrogate6(ctx, &key);
	if (!svc || svc->rev_nat_index != rval->rev_nat_index || svc->count == 0) {
		bpf_map_delete_elem(&cilium_lb6_reverse_sk, &rkey);
		return;
	}
	ctx_set_ip6(ctx, &rval->address);
	ctx->user_port = (__u32)rval->port;
}

/* connect and sendmsg: a service without a backend fails the call (Cilium's connect4
 * does the same); anything else proceeds, translated or not. */
static __always_inline int verdict(int err)
{
	if (err == -EHOSTUNREACH) {
		bpf_set_retval(-EHOSTUNREACH);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

/* The eight entry points: forward translation on connect and sendmsg, reverse on
 * recvmsg and getpeername, per family. */
#define FWD_HOOK(sec, name, xlate)                          \
	SEC(sec)                                            \
	int name(struct bpf_sock_addr *ctx)                 \
	{                                                   \
		return verdict(xlate(ctx));                 \
	}
#define REV_HOOK(sec, name, xlate)                          \
	SEC(sec)                                            \
	int name(struct bpf_sock_addr *ctx)                 \
	{                                                   \
		xlate(ctx);                                 \
		return SYS_PROCEED;                         \
	}

FWD_HOOK("cgroup/connect4", sock4_connect, xlate_fwd)
FWD_HOOK("cgroup/sendmsg4", sock4_sendmsg, xlate_fwd)
REV_HOOK("cgroup/recvmsg4", sock4_recvmsg, xlate_rev)
REV_HOOK("cgroup/getpeername4", sock4_getpeername, xlate_rev)
FWD_HOOK("cgroup/connect6", sock6_connect, xlate_fwd6)
FWD_HOOK("cgroup/sendmsg6", sock6_sendmsg, xlate_fwd6)
REV_HOOK("cgroup/recvmsg6", sock6_recvmsg, xlate_rev6)
REV_HOOK("cgroup/getpeername6", sock6_getpeername, xlate_rev6)

char _license[] SEC("license") = "GPL";
