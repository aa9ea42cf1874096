//! The sampling (the Python `Sampler`'s exact shares, each role on its own, a sampler kept
//! or made anew as the role's mirror is), and the hand-over through a real server over
//! HTTP: one per batch, after the answers, with each sampled request's inputs, outputs,
//! server time, slice header's value and roles.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataplane_core::tensor::TensorData;

use super::{Mirror, MirrorRole, MirroredBatch, Mirroring, Sampler, Samplers};
use crate::server::tests::{call, client, infer_body, serve};

fn role(name: &str, percent: u32, token: u64) -> MirrorRole {
    MirrorRole {
        role: name.into(),
        percent,
        token,
    }
}

fn taken(sampler: &mut Sampler, calls: usize) -> Vec<bool> {
    (0..calls).map(|_| sampler.take()).collect()
}

#[test]
fn a_sampler_takes_exactly_its_share_of_every_hundred_the_first_taken() {
    for percent in [1, 5, 25, 33, 50, 99, 100] {
        let mut sampler = Sampler::new(percent).unwrap();
        assert!(sampler.take(), "{percent}%: the first call is taken");
        let mut sampler = Sampler::new(percent).unwrap();
        for hundred in 0..3 {
            let count = taken(&mut sampler, 100).iter().filter(|t| **t).count();
            assert_eq!(count, percent as usize, "{percent}% of hundred {hundred}");
        }
    }
    let mut quarter = Sampler::new(25).unwrap();
    assert_eq!(
        taken(&mut quarter, 8),
        [true, false, false, false, true, false, false, false]
    );
    assert_eq!(
        Sampler::new(101).unwrap_err(),
        "percent 101 is outside 0..100"
    );
}

#[test]
fn each_role_samples_on_its_own_and_a_new_mirror_starts_a_new_sampler() {
    let samplers = Samplers::default();
    assert!(samplers.sample(3).is_none(), "nothing mirrored");
    let mirroring = |roles| Mirroring {
        roles,
        slice_header: Some("x-slice".into()),
    };
    samplers
        .set(mirroring(vec![
            role("shadow", 50, 1),
            role("quality", 25, 2),
        ]))
        .unwrap();
    assert_eq!(samplers.slice_header().as_deref(), Some("x-slice"));
    let (names, taken) = samplers.sample(4).unwrap();
    assert_eq!(names, ["shadow", "quality"]);
    // shadow takes the 1st and 3rd, quality the 1st
    assert_eq!(taken, vec![(0, vec![0, 1]), (2, vec![0])]);

    // The same mirrors (tokens): their credits go on.
    samplers
        .set(mirroring(vec![
            role("shadow", 50, 1),
            role("quality", 25, 2),
        ]))
        .unwrap();
    let (_, taken) = samplers.sample(4).unwrap();
    assert_eq!(taken, vec![(0, vec![0, 1]), (2, vec![0])]);
    // Another shadow mirror: a fresh sampler, which takes its first request.
    samplers
        .set(mirroring(vec![
            role("shadow", 50, 3),
            role("quality", 25, 2),
        ]))
        .unwrap();
    let (_, taken) = samplers.sample(1).unwrap();
    assert_eq!(taken, vec![(0, vec![0, 1])]);

    assert!(
        samplers
            .set(mirroring(vec![role("shadow", 101, 4)]))
            .is_err()
    );
    samplers.set(Mirroring::default()).unwrap();
    assert!(samplers.sample(1).is_none() && samplers.slice_header().is_none());
}

#[derive(Default)]
struct Collected(Mutex<Vec<MirroredBatch>>);

impl Mirror for Collected {
    fn hand_over(&self, batch: MirroredBatch) {
        self.0.lock().unwrap().push(batch);
    }
}

#[test]
fn a_batchs_sampled_requests_are_handed_over_once_with_what_the_mirror_compares() {
    let (server, _) = serve(0, Duration::ZERO);
    let collected = Arc::new(Collected::default());
    server.set_mirror(collected.clone()).unwrap();
    let port = server.http_port();
    let infer = |rows: Vec<[f32; 2]>, slice: Option<&'static str>| async move {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        let mut request = hyper::Request::post("/v2/models/double/infer")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json");
        if let Some(slice) = slice {
            request = request.header("X-Slice", slice);
        }
        let body = http_body_util::Full::new(bytes::Bytes::from(infer_body(&rows)));
        sender
            .send_request(request.body(body).unwrap())
            .await
            .unwrap()
            .status()
    };
    client().block_on(async {
        assert_eq!(infer(vec![[1.0, 2.0]], None).await, 200);
        assert!(
            collected.0.lock().unwrap().is_empty(),
            "nothing mirrored yet"
        );

        server
            .set_mirroring(Mirroring {
                roles: vec![role("shadow", 50, 1)],
                slice_header: Some("x-slice".into()),
            })
            .unwrap();
        assert_eq!(
            infer(vec![[1.0, 2.0], [3.0, 4.0]], Some("night")).await,
            200
        );
        assert_eq!(infer(vec![[5.0, 6.0]], None).await, 200); // not taken: 50 %
        let refused = call(port, "POST", "/v2/models/double/infer", b"{").await.0;
        assert_eq!(
            refused, 400,
            "refused requests are not answered, nor counted"
        );
    });
    let batches = collected.0.lock().unwrap().clone();
    assert_eq!(batches.len(), 2, "one hand-over per batch answered");
    assert_eq!(
        batches.iter().map(|b| b.answered).collect::<Vec<_>>(),
        [1, 1]
    );
    let sampled = &batches[0].requests;
    assert_eq!(sampled.len(), 1);
    let request = &sampled[0];
    assert_eq!(batches[0].roles, ["shadow"]);
    assert_eq!(request.roles, [0]);
    assert_eq!(request.slice_value.as_deref(), Some("night"));
    assert!(request.server_seconds > 0.0);
    let floats = |data: &TensorData| match data {
        TensorData::Raw(raw) => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<_>>(),
        TensorData::Strings(_) => panic!("FP32"),
    };
    let (x, y) = (&request.inputs[0], &request.outputs[0]);
    assert_eq!((x.name.as_str(), x.shape.clone()), ("x", vec![2, 2]));
    assert_eq!(floats(&x.data), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!((y.name.as_str(), y.shape.clone()), ("y", vec![2, 2]));
    assert_eq!(floats(&y.data), [2.0, 4.0, 6.0, 8.0]);
    assert!(batches[1].requests.is_empty(), "the second was not sampled");
    server.shutdown();
}
