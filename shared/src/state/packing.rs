//! Claim bodies packed for storage (pure): the JSON deflated against a preset
//! dictionary of the text claims share. A claim is about 1.3 KB of JSON, most
//! of it field names, label keys and instance-type names every claim repeats;
//! packed it is a few hundred bytes, and every whole-claim list reads a third
//! of the units (DynamoDB charges reads by the bytes stored).

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The first byte of a packed body: raw deflate against [`CLAIM_WORDS_1`].
const DEFLATE_CLAIM_WORDS_1: u8 = 1;

/// The most a packed body may unpack to: a DynamoDB item's limit (so a
/// damaged or hostile item cannot make a reader allocate without bound).
const MAX_UNPACKED: usize = 400 * 1024;

/// Text claim bodies share, the most common last (deflate finds nearer
/// matches in fewer bits). Items packed with it must stay readable: never
/// edit it; a better dictionary is a new one with its own first byte.
const CLAIM_WORDS_1: &str = concat!(
    // Instance families and sizes, as the options and the launched type name them.
    "a1.c5.c5a.c5ad.c5d.c5n.c6a.c6g.c6gd.c6gn.c6i.c6id.c6in.c7a.c7g.c7gd.c7gn.c7i.c7i-flex.c8g.",
    "d3.g4dn.g5.g6.i3.i3en.i4g.i4i.inf2.m5a.m5ad.m5d.m5dn.m5n.m5zn.m6a.m6g.m6gd.m6i.m6id.m6idn.m6in.",
    "m7a.m7g.m7gd.m7i.m7i-flex.m8g.r5a.r5ad.r5b.r5d.r5dn.r5n.r6a.r6g.r6gd.r6i.r6id.r6idn.r6in.",
    "r7a.r7g.r7gd.r7i.r7iz.r8g.t3.t3a.t4g.x2gd.x2idn.z1d.",
    r#"medium",".metal",".48xlarge",".32xlarge",".24xlarge",".16xlarge",".12xlarge",".8xlarge",".4xlarge","#,
    // Labels, taints and a launch in flight.
    r#""kubernetes.io/os":"linux","kubernetes.io/arch":"arm64","topology.kubernetes.io/zone":"#,
    r#""karpenter.k8s.aws/instance-generation","karpenter.k8s.aws/instance-size","karpenter.k8s.aws/instance-cpu","#,
    r#""karpenter.k8s.aws/instance-category","operator":"Gt","operator":"Exists","#,
    r#""startupTaints":[{"key":"node.cloudprovider.kubernetes.io/uninitialized","effect":"NoSchedule","value":"true"}],"#,
    r#""annotations":{},"terminationGracePeriod":"","replacementFor":"","capacityReservation":"#,
    r#""imageId":"ami-0","launchAttempt":{"number":1,"clientToken":"nodesmith-","capacityType":"spot","#,
    r#""overrides":[],"tags":{"karpenter.sh/nodepool":"","eks:eks-cluster-name":""},"concluded":false},"#,
    // A launched claim, field by field as it is written.
    r#"{"name":"default-","nodePool":"default","nodeClass":"default","requirements":[{"key":"karpenter.k8s.aws/instance-family","operator":"In","values":["c5","m5","r5"]},"#,
    r#"{"key":"karpenter.sh/capacity-type","operator":"In","values":["on-demand","spot"]},"#,
    r#"{"key":"karpenter.sh/nodepool","operator":"In","values":["general"]},"#,
    r#"{"key":"node.kubernetes.io/instance-type","operator":"In"}],"#,
    r#""resources":{"cpu":"3100m","memory":"7808Mi","pods":"31"},"#,
    r#""instanceTypeOptions":["m5.large","m5.xlarge","m5.2xlarge","c5.large","c5.xlarge","c5.2xlarge","r5.large","r5.xlarge","r5.2xlarge"],"#,
    r#""labels":{"karpenter.sh/nodepool":"general"},"taints":[],"startupTaints":[],"phase":"Initialized","#,
    r#""instanceId":"i-0","providerId":"aws:///us-east-1a/i-0","instanceType":"m5.xlarge","zone":"us-east-1a","#,
    r#""capacityType":"on-demand","price":0.,"nodeName":"ip-10-0-","nodepoolHash":"","nodeclassHash":"","#,
    r#""timestamps":{"created":"2026-12-01T00:00:00.000000Z","launched":"2026-12-01T00:00:00.000000Z","#,
    r#""registered":"2026-12-01T00:00:00.000000Z","initialized":"2026-12-01T00:00:00.000000Z"},"version":"#,
);

/// Why a packed body cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PackingError {
    /// Nothing was stored.
    #[error("the packed body is empty")]
    Empty,
    /// Packed in a way this release does not know (a newer release's).
    #[error("unknown packing {0} (this release reads packing {DEFLATE_CLAIM_WORDS_1})")]
    UnknownPacking(u8),
    /// The deflate stream is damaged.
    #[error("the packed body does not inflate")]
    Inflate(#[source] flate2::DecompressError),
    /// The deflate stream ends before its end.
    #[error("the packed body is cut short")]
    Truncated,
    /// It unpacks to more than an item can hold.
    #[error("the packed body unpacks to more than {MAX_UNPACKED} bytes")]
    TooLarge,
    /// It unpacks to bytes that are not text.
    #[error("the packed body is not UTF-8")]
    NotText(#[source] std::string::FromUtf8Error),
    /// The deflater refused (never seen; kept rather than unwrapped).
    #[error("cannot pack the body")]
    Deflate(#[source] flate2::CompressError),
}

/// `body` packed: one byte naming the packing, then the deflate stream.
pub fn pack(body: &str) -> Result<Vec<u8>, PackingError> {
    let mut deflater = Compress::new(Compression::best(), false);
    deflater
        .set_dictionary(CLAIM_WORDS_1.as_bytes())
        .map_err(PackingError::Deflate)?;
    let input = body.as_bytes();
    let mut out = Vec::with_capacity(input.len() / 2 + 64);
    out.push(DEFLATE_CLAIM_WORDS_1);
    loop {
        let read = usize::try_from(deflater.total_in())
            .unwrap_or(input.len())
            .min(input.len());
        match deflater
            .compress_vec(&input[read..], &mut out, FlushCompress::Finish)
            .map_err(PackingError::Deflate)?
        {
            Status::StreamEnd => return Ok(out),
            // Out of room: `compress_vec` writes only into spare capacity.
            Status::Ok | Status::BufError => out.reserve(out.capacity().max(256)),
        }
    }
}

/// The body `packed` holds.
pub fn unpack(packed: &[u8]) -> Result<String, PackingError> {
    let (&packing, stream) = packed.split_first().ok_or(PackingError::Empty)?;
    if packing != DEFLATE_CLAIM_WORDS_1 {
        return Err(PackingError::UnknownPacking(packing));
    }
    let mut inflater = Decompress::new(false);
    inflater
        .set_dictionary(CLAIM_WORDS_1.as_bytes())
        .map_err(PackingError::Inflate)?;
    let mut out = Vec::with_capacity(stream.len() * 4);
    loop {
        let (read_before, out_before) = (inflater.total_in(), out.len());
        let read = usize::try_from(read_before).unwrap_or(stream.len()).min(stream.len());
        let status = inflater
            .decompress_vec(&stream[read..], &mut out, FlushDecompress::Finish)
            .map_err(PackingError::Inflate)?;
        if out.len() > MAX_UNPACKED {
            return Err(PackingError::TooLarge);
        }
        if status == Status::StreamEnd {
            return String::from_utf8(out).map_err(PackingError::NotText);
        }
        let stuck = inflater.total_in() == read_before && out.len() == out_before;
        if stuck && out.len() < out.capacity() {
            // Room left, nothing read or written: the input ran out first.
            return Err(PackingError::Truncated);
        }
        out.reserve(out.capacity().max(256));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_dictionary_is_the_one_items_were_packed_with() {
        // Packed items stay readable only while these bytes stay the same.
        use sha2::{Digest, Sha256};
        let digest = hex::encode(Sha256::digest(CLAIM_WORDS_1.as_bytes()));
        assert_eq!(
            &digest[..16],
            "f1b7fc15c209697f",
            "CLAIM_WORDS_1 changed: add a new dictionary instead"
        );
    }

    #[test]
    fn a_damaged_packed_body_is_refused_with_what_is_wrong() {
        let packed = pack(r#"{"name":"default-x1"}"#).unwrap();
        let cases: [(&str, Vec<u8>, &str); 4] = [
            ("empty", Vec::new(), "empty"),
            (
                "a newer packing",
                [&[9u8][..], &packed[1..]].concat(),
                "unknown packing 9",
            ),
            ("cut short", packed[..packed.len() / 2].to_vec(), "cut short"),
            (
                "not deflate",
                vec![DEFLATE_CLAIM_WORDS_1, 0xff, 0xff, 0xff],
                "does not inflate",
            ),
        ];
        for (what, bytes, expected) in cases {
            let e = unpack(&bytes).unwrap_err().to_string();
            assert!(e.contains(expected), "{what}: {e}");
        }
    }

    #[test]
    fn a_body_that_unpacks_past_an_items_limit_is_refused() {
        let big = "x".repeat(MAX_UNPACKED + 1);
        let e = unpack(&pack(&big).unwrap()).unwrap_err();
        assert!(matches!(e, PackingError::TooLarge), "{e}");
    }

    proptest! {
        #[test]
        fn any_text_unpacks_to_what_was_packed(body in ".{0,3000}") {
            prop_assert_eq!(unpack(&pack(&body).unwrap()).unwrap(), body);
        }
    }
}
