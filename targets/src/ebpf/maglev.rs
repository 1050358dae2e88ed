//! Cilium's Maglev lookup tables (`pkg/maglev/maglev.go`), computed as the agent computes
//! them so that a table written here equals the one a cilium-agent with the same options
//! writes for the same backends:
//! - each backend is named by its hash string (`BackendInfo.setHashString`):
//!   `[ADDR:PORT/PROTO,State:active]`, an IPv6 address in brackets;
//! - backends are sorted by that string (`GetLookupTable`), never by their node-local ids;
//! - a backend's permutation starts at `h1 % M` and steps by `h2 % (M - 1) + 1`, where
//!   `(h1, h2)` is MurmurHash3 x64 128 of the hash string seeded with the first four bytes
//!   of the decoded `--bpf-lb-maglev-hash-seed` (`getOffsetAndSkip`, `UserConfig.ToConfig`,
//!   `pkg/murmur3/murmur3.go`, `Hash128`);
//! - the table is filled in turns, backend `n % len` first, each taking the next free
//!   entry of its permutation; with weights (`weightSum / len > 1`, which Cilium's default
//!   weight of 100 always meets) a backend's turn passes to the next backend while
//!   `(n + 1) * weight < counter`, counters starting at `weight / len` and growing by the
//!   weight sum each time the backend takes an entry (`computeLookupTable`).
//!
//! Checked against Cilium's own expectations (`pkg/maglev/maglev_test.go`,
//! `TestReproducible`, `TestWeightedBackendWithRemoval`) and against tables printed by a
//! Go program with Cilium's code (`testdata/maglev/README.md`).

use std::net::SocketAddr;
use svc_compiler::ir::Protocol;

/// `maglev.DefaultTableSize`: M, the entries of every table.
pub const DEFAULT_TABLE_SIZE: u32 = 16381;

/// `maglev.DefaultHashSeed`.
pub const DEFAULT_HASH_SEED: &str = "JLfvgnHc2kaSUFaI";

/// The table sizes the agent accepts (`maglevSupportedTableSizes`): primes.
pub const TABLE_SIZES: [u32; 10] = [
    251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071,
];

/// `loadbalancer.DefaultBackendWeight`: the weight of every backend of a Kubernetes
/// endpoint (`reflectors/conversions.go`, `convertEndpoints`).
pub const DEFAULT_WEIGHT: u16 = 100;

/// The murmur3 seed of a `--bpf-lb-maglev-hash-seed` (base64 of 12 bytes; the first four
/// as a big-endian number, the others seed the datapath's jhash), or why it is refused.
pub fn seed_of(hash_seed: &str) -> Result<u32, String> {
    let d = data_encoding::BASE64
        .decode(hash_seed.as_bytes())
        .map_err(|e| format!("not base64 ({e})"))?;
    if d.len() != 12 {
        return Err(format!("decodes to {} bytes, not 12", d.len()));
    }
    Ok(u32::from_be_bytes([d[0], d[1], d[2], d[3]]))
}

/// A table size the agent accepts, or why not.
pub fn check_table_size(m: u32) -> Result<(), String> {
    if TABLE_SIZES.contains(&m) {
        Ok(())
    } else {
        let sizes: Vec<String> = TABLE_SIZES.iter().map(u32::to_string).collect();
        Err(format!(
            "{m} is not one of Cilium's sizes ({})",
            sizes.join(", ")
        ))
    }
}

/// A backend's name in the permutation and the sort (`setHashString`): Cilium's backend
/// addresses are external-scope, so no `/i`.
pub fn hash_string(addr: SocketAddr, proto: Protocol) -> String {
    format!("[{addr}/{},State:active]", proto.as_str())
}

/// MurmurHash3 x64 128 (`pkg/murmur3`, `Hash128`: little-endian blocks, as on the
/// x86-64 and arm64 nodes Cilium runs on).
pub fn murmur3_128(data: &[u8], seed: u32) -> (u64, u64) {
    const C1: u64 = 0x87c3_7b91_1142_53d5;
    const C2: u64 = 0x4cf5_ad43_2745_937f;
    let fmix = |mut k: u64| {
        k ^= k >> 33;
        k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        k ^= k >> 33;
        k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        k ^ (k >> 33)
    };
    let (mut h1, mut h2) = (seed as u64, seed as u64);
    let blocks = data.chunks_exact(16);
    let tail = blocks.remainder();
    for b in blocks {
        let k1 = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        let k2 = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
        h1 ^= k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);
        h2 ^= k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }
    let word = |bytes: &[u8]| {
        bytes
            .iter()
            .enumerate()
            .fold(0u64, |k, (i, b)| k ^ ((*b as u64) << (8 * i)))
    };
    if tail.len() > 8 {
        h2 ^= word(&tail[8..])
            .wrapping_mul(C2)
            .rotate_left(33)
            .wrapping_mul(C1);
    }
    if !tail.is_empty() {
        h1 ^= word(&tail[..tail.len().min(8)])
            .wrapping_mul(C1)
            .rotate_left(31)
            .wrapping_mul(C2);
    }
    h1 ^= data.len() as u64;
    h2 ^= data.len() as u64;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    (h1, h2)
}

/// The lookup table of `m` entries for backends given as (hash string, weight), in any
/// order: each entry the index of its backend in the list sorted by hash string (the
/// order the caller gets back). Empty without backends (the reconciler then deletes the
/// service's table).
pub fn lookup_table(backends: &[(String, u16)], m: u32, seed: u32) -> (Vec<usize>, Vec<u32>) {
    let mut order: Vec<usize> = (0..backends.len()).collect();
    order.sort_by(|&a, &b| backends[a].0.cmp(&backends[b].0));
    let l = order.len();
    if l == 0 {
        return (order, Vec::new());
    }
    let m64 = m as u64;
    // (offset, skip) per backend: its permutation is offset + j * skip (mod m), the same
    // numbers `getPermutation` fills in one step at a time.
    let perm: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| {
            let (h1, h2) = murmur3_128(backends[i].0.as_bytes(), seed);
            (h1 % m64, h2 % (m64 - 1) + 1)
        })
        .collect();
    let weights: Vec<u64> = order.iter().map(|&i| backends[i].1 as u64).collect();
    let weight_sum: u64 = weights.iter().sum();
    // Cilium keeps the counters as float64 and truncates them when comparing; the same
    // arithmetic here gives the same turns.
    let mut counter: Vec<f64> = weights.iter().map(|&w| w as f64 / l as f64).collect();
    let weighted = weight_sum / l as u64 > 1;
    let mut next = vec![0u64; l];
    const FREE: u32 = u32::MAX;
    let mut entry = vec![FREE; m as usize];
    for n in 0..m64 {
        let mut i = (n % l as u64) as usize;
        if weighted {
            // Terminates: were every backend passed over, the counters would sum to more
            // than (n + 1) times the weight sum, but they sum to n + 1/len times it.
            while (n + 1) * weights[i] < counter[i] as u64 {
                i = (i + 1) % l;
            }
            counter[i] += weight_sum as f64;
        }
        let (offset, skip) = perm[i];
        let mut c = ((offset + next[i] * skip) % m64) as usize;
        while entry[c] != FREE {
            next[i] += 1;
            c = ((offset + next[i] * skip) % m64) as usize;
        }
        entry[c] = i as u32;
        next[i] += 1;
    }
    (order, entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn seed() -> u32 {
        seed_of(DEFAULT_HASH_SEED).unwrap()
    }

    /// `mkAddr(i)` of Cilium's maglev_test.go: address i as a big-endian u32, port i, TCP.
    fn mk_addr(i: u32) -> String {
        hash_string(
            SocketAddr::new(std::net::Ipv4Addr::from(i).into(), i as u16),
            Protocol::TCP,
        )
    }

    fn rle(ids: &[u32]) -> String {
        let mut runs: Vec<String> = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let j = (i..ids.len())
                .find(|&j| ids[j] != ids[i])
                .unwrap_or(ids.len());
            runs.push(format!("{}({})", ids[i], j - i));
            i = j;
        }
        runs.join(",")
    }

    /// The table as backend ids: `ids[k]` is the id of the k-th backend as given.
    fn table_ids(backends: &[(String, u16)], ids: &[u32], m: u32) -> Vec<u32> {
        let (order, table) = lookup_table(backends, m, seed());
        table.iter().map(|&t| ids[order[t as usize]]).collect()
    }

    #[test]
    fn murmur3_reference_values() {
        // MurmurHash3_x64_128 of the empty input with seed 0 is 0 (smhasher); "hello"
        // with seed 0 is cbd8a7b341bd9b02 5b1e906a48ae1d19 as h1, h2 (the reference's
        // digest bytes read as two little-endian words).
        assert_eq!(murmur3_128(b"", 0), (0, 0));
        assert_eq!(
            murmur3_128(b"hello", 0),
            (0xcbd8_a7b3_41bd_9b02, 0x5b1e_906a_48ae_1d19)
        );
    }

    #[test]
    fn default_seed_and_sizes() {
        // "JLfvgnHc2kaSUFaI" decodes to 24 b7 ef 82 71 dc da 46 92 50 56 88.
        assert_eq!(seed(), 0x24b7_ef82);
        assert!(seed_of("JLfvgnHc2kaS").is_err());
        assert!(seed_of("not base64!").is_err());
        assert!(check_table_size(16381).is_ok());
        assert!(check_table_size(16383).is_err());
    }

    /// `TestReproducible` (pkg/maglev/maglev_test.go): M = 251, the default seed, backends
    /// mkAddr(1), (3), (4), (5) with weights 2, 13, 111, 10 and ids 0-3; the expected
    /// table as Cilium's run-length encoding.
    #[test]
    fn cilium_test_reproducible() {
        let backends: Vec<(String, u16)> = [(1, 2), (3, 13), (4, 111), (5, 10)]
            .iter()
            .map(|&(a, w)| (mk_addr(a), w))
            .collect();
        let expected = "2(5),3(1),2(3),1(1),2(2),0(1),2(1),3(1),2(1),3(1),2(1),1(1),2(7),1(1),2(14),3(1),2(1),\
1(2),2(12),3(1),2(3),1(1),2(4),3(1),2(8),3(1),2(2),1(1),2(16),1(2),2(3),3(1),2(11),1(2),2(4),3(1),2(3),\
1(1),2(4),3(1),2(1),0(1),1(1),2(8),1(1),2(7),1(1),2(4),3(1),2(1),3(1),2(9),1(2),2(5),1(1),2(7),3(1),2(1),\
3(1),1(1),2(8),1(1),2(4),0(1),2(1),1(1),2(5),3(1),2(3),1(1),2(4),3(1),2(3),1(1),2(12),0(1),3(1),2(3),3(1),\
2(4),3(1),2(2),1(1),2(7)";
        assert_eq!(rle(&table_ids(&backends, &[0, 1, 2, 3], 251)), expected);
    }

    /// `TestWeightedBackendWithRemoval`: M = 1021, weights 2, 13, 111, 10 → each backend's
    /// share of the table is 16, 98, 832 and 75 entries.
    #[test]
    fn cilium_weighted_counts() {
        let backends: Vec<(String, u16)> = [(1, 2), (2, 13), (3, 111), (4, 10)]
            .iter()
            .map(|&(a, w)| (mk_addr(a), w))
            .collect();
        let table = table_ids(&backends, &[1, 2, 3, 4], 1021);
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for id in table {
            *counts.entry(id).or_default() += 1;
        }
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [(1, 16), (2, 98), (3, 832), (4, 75)]
        );
    }

    /// pkg/loadbalancer/tests/testdata/nodeport-maglev.txtar: four backends
    /// 10.244.1.1-4:80/TCP (ids 1-4, weight 100) in a 1021-entry table:
    /// `INNER=[1(256), 2(255), 3(255), 4(255)]`.
    #[test]
    fn cilium_nodeport_maglev_counts() {
        let backends: Vec<(String, u16)> = (1..=4)
            .map(|i| {
                let a: SocketAddr = format!("10.244.1.{i}:80").parse().unwrap();
                (hash_string(a, Protocol::TCP), DEFAULT_WEIGHT)
            })
            .collect();
        let table = table_ids(&backends, &[1, 2, 3, 4], 1021);
        let count = |id| table.iter().filter(|&&t| t == id).count();
        assert_eq!(
            [count(1), count(2), count(3), count(4)],
            [256, 255, 255, 255]
        );
    }

    /// The tables a Go program with Cilium's code printed (`targets/testdata/maglev`,
    /// README there): table sizes 251, 1021 and 16381, the default and another seed, IPv4
    /// and IPv6, TCP, UDP and SCTP, equal and unequal weights, one to 300 backends.
    #[test]
    fn go_fixtures() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/maglev");
        let mut checked = 0;
        for f in std::fs::read_dir(&dir).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_none_or(|e| e != "txt") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let (mut m, mut seed, mut backends, mut ids) = (0, 0, Vec::new(), Vec::new());
            let mut expected = "";
            for line in text.lines() {
                let field = |k: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(k))
                        .unwrap()
                        .to_string()
                };
                if line.starts_with("# m=") {
                    m = field("m=").parse().unwrap();
                    seed = seed_of(&field("seed=")).unwrap();
                } else if line.starts_with("# backend") {
                    let proto = match field("proto=").as_str() {
                        "TCP" => Protocol::TCP,
                        "UDP" => Protocol::UDP,
                        _ => Protocol::SCTP,
                    };
                    let addr: SocketAddr = field("addr=").parse().unwrap();
                    backends.push((hash_string(addr, proto), field("weight=").parse().unwrap()));
                    ids.push(field("id=").parse::<u32>().unwrap());
                } else {
                    expected = line;
                }
            }
            let (order, table) = lookup_table(&backends, m, seed);
            let got: Vec<u32> = table.iter().map(|&t| ids[order[t as usize]]).collect();
            assert_eq!(rle(&got), expected, "{}", path.display());
            checked += 1;
        }
        assert_eq!(checked, 5, "every fixture of {}", dir.display());
    }

    #[test]
    fn order_does_not_matter_and_ipv6_is_bracketed() {
        let a: SocketAddr = "[fd00::1]:53".parse().unwrap();
        assert_eq!(
            hash_string(a, Protocol::UDP),
            "[[fd00::1]:53/UDP,State:active]"
        );
        let b = vec![("x".to_string(), 100), ("a".to_string(), 100)];
        let c = vec![("a".to_string(), 100), ("x".to_string(), 100)];
        assert_eq!(table_ids(&b, &[7, 9], 251), table_ids(&c, &[9, 7], 251));
        assert!(lookup_table(&[], 251, seed()).1.is_empty());
    }
}
