//! Every response's fields against a per-band GCRA model
//! (`algorithm::FunnelState`), under paused time.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio_ratelimit::algorithm::FunnelState;
use tokio_ratelimit::http::{ClientKey, Header, HttpRateLimitLayer};
use tokio_ratelimit::keyed::KeyedFunnel;
use tokio_ratelimit::{Quota, Rate};
use tower::{Layer, ServiceExt, service_fn};

mod support;
use support::Lcg;

type Svc = tower::util::BoxCloneService<Request<Body>, Response<Body>, Infallible>;

fn model(q: &Quota) -> Vec<FunnelState> {
    q.bands()
        .iter()
        .map(|b| FunnelState::new(b.rate(), b.capacity()).unwrap())
        .collect()
}

/// Pours 1 into every band or none; Err(max wait).
fn pour(m: &mut Vec<FunnelState>, now: Duration) -> Result<(), Duration> {
    let mut copy = m.clone();
    let mut wait = None;
    for f in &mut copy {
        if let Err(e) = f.try_pour(now, 1) {
            let w = e.retry_after().unwrap();
            wait = Some(wait.map_or(w, |x: Duration| x.max(w)));
        }
    }
    match wait {
        None => {
            *m = copy;
            Ok(())
        }
        Some(w) => Err(w),
    }
}

fn parse_ratelimit(v: &str) -> Vec<(String, u64, u64)> {
    v.split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let r = parts
                .next()
                .unwrap()
                .strip_prefix("r=")
                .unwrap()
                .parse()
                .unwrap();
            let t = parts
                .next()
                .unwrap()
                .strip_prefix("t=")
                .unwrap()
                .parse()
                .unwrap();
            (name, r, t)
        })
        .collect()
}

fn secs_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

async fn run(quotas: &[Quota], seed: u64, steps: usize) {
    let mut b = KeyedFunnel::<ClientKey>::builder();
    b.quota(quotas[0]).background_sweep(false);
    for q in &quotas[1..] {
        b.tier(*q);
    }
    let map = b.build().unwrap();
    let qs: Vec<Quota> = quotas.to_vec();
    let layer = HttpRateLimitLayer::new(map, Header::new("x-key"))
        .legacy_headers(true)
        .quota_for(move |k| match k {
            ClientKey::Value(v) => {
                let i: usize = v.trim_start_matches('k').parse().unwrap();
                Some(qs[i % qs.len()])
            }
            _ => None,
        });
    let svc: Svc =
        tower::util::BoxCloneService::new(layer.layer(service_fn(|_: Request<Body>| {
            futures::future::ready(Ok::<_, Infallible>(Response::new(Body::empty())))
        })));
    let start = tokio::time::Instant::now();
    let keys = quotas.len() * 2;
    let mut models: Vec<Vec<FunnelState>> = (0..keys)
        .map(|i| model(&quotas[i % quotas.len()]))
        .collect();
    let mut rng = Lcg(seed);
    for step in 0..steps {
        let adv = match rng.below(4) {
            0 => 0,
            1 => rng.below(50),
            2 => rng.below(1000),
            _ => rng.below(5000),
        };
        tokio::time::advance(Duration::from_millis(adv)).await;
        let k = usize::try_from(rng.below(keys as u64)).unwrap();
        let now = start.elapsed();
        let req = Request::get("/")
            .header("x-key", format!("k{k}"))
            .body(Body::empty())
            .unwrap();
        let resp = svc.clone().oneshot(req).await.unwrap();
        let quota = quotas[k % quotas.len()];
        let m = &mut models[k];
        let expect = pour(m, now);
        let ctx = format!("seed {seed} step {step} key k{k} now {now:?} quota {quota:?}");
        match expect {
            Ok(()) => {
                assert_eq!(resp.status(), StatusCode::OK, "{ctx}");
                assert!(resp.headers().get("retry-after").is_none(), "{ctx}");
            }
            Err(w) => {
                assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{ctx}");
                let ra: u64 = resp.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(ra, secs_up(w).max(1), "{ctx} retry-after, exact wait {w:?}");
            }
        }
        // Fields against the model's bands.
        let rl = resp.headers()["ratelimit"].to_str().unwrap().to_owned();
        let items = parse_ratelimit(&rl);
        assert_eq!(items.len(), quota.bands().len(), "{ctx} {rl}");
        let mut legacy_expect = None::<(u64, u64, u64)>;
        for ((name, r, t), f) in items.iter().zip(m.iter()) {
            let free = u64::from(f.free(now));
            assert_eq!(*r, free, "{ctx} {rl}: r of {name}");
            let cap = u64::from(f.capacity());
            if free == cap {
                assert_eq!(*t, 0, "{ctx} {rl}: t of full {name}");
            } else {
                assert!(*t >= 1, "{ctx} {rl}: t of {name}");
                assert!(
                    u64::from(f.free(now + Duration::from_secs(*t))) > free,
                    "{ctx} {rl}: t of {name} too short"
                );
                assert_eq!(
                    u64::from(f.free(now + Duration::from_secs(*t - 1))),
                    free,
                    "{ctx} {rl}: t of {name} too long"
                );
            }
            let _ = legacy_expect.get_or_insert((free, *t, 0));
        }
        // The policy names the requester's tier.
        let pol = resp.headers()["ratelimit-policy"].to_str().unwrap();
        for ((name, _, _), band) in items.iter().zip(quota.bands()) {
            assert!(pol.contains(&format!("\"{name}\"")), "{ctx} {pol}");
            let _ = band;
        }
        // Legacy: remaining is the fewest r.
        let lr: u64 = resp.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(lr, items.iter().map(|i| i.1).min().unwrap(), "{ctx}");
    }
}

#[tokio::test(start_paused = true)]
async fn fields_agree_with_gcra_one_band() {
    for seed in 0..20 {
        run(
            &[Quota::new(Rate::per(3, Duration::from_secs(7)), 5)],
            seed,
            300,
        )
        .await;
    }
}

#[tokio::test(start_paused = true)]
async fn fields_agree_with_gcra_two_bands() {
    for seed in 0..20 {
        run(
            &[Quota::new(Rate::per(2, Duration::from_millis(1500)), 4)
                .and(Rate::per(7, Duration::from_secs(60)), 9)],
            seed,
            300,
        )
        .await;
    }
}

#[tokio::test(start_paused = true)]
async fn fields_agree_with_gcra_tiers() {
    for seed in 0..20 {
        run(
            &[
                Quota::new(Rate::per_second(2), 3).and(Rate::per_minute(10), 10),
                Quota::new(Rate::per(5, Duration::from_secs(3)), 6).and(Rate::per_minute(20), 20),
                Quota::new(Rate::per(1, Duration::from_millis(700)), 2),
            ],
            seed,
            300,
        )
        .await;
    }
}
