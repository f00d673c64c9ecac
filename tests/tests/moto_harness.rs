//! The harness itself: moto starts, resets between tests, and serves the seeded
//! parts it lacks through the real SDK.

use nodesmith_tests::moto::moto;

#[tokio::test]
async fn reset_wipes_state_between_tests() {
    let m = moto().await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    sqs.create_queue().queue_name("left-behind").send().await.unwrap();
    assert_eq!(sqs.list_queues().send().await.unwrap().queue_urls().len(), 1);
    drop(m);
    let m = moto().await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    assert!(sqs.list_queues().send().await.unwrap().queue_urls().is_empty());
}

#[tokio::test]
async fn eks_ami_parameters_are_seeded_and_resolve_to_images() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&conf);
    let p = ssm
        .get_parameter()
        .name("/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/standard/recommended/image_id")
        .send()
        .await
        .unwrap();
    let ami = p.parameter().and_then(|p| p.value()).unwrap().to_string();
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let images = ec2.describe_images().image_ids(&ami).send().await.unwrap();
    let image = &images.images()[0];
    assert_eq!(image.architecture().map(|a| a.as_str()), Some("arm64"));
    assert!(image.name().unwrap().starts_with("amazon-eks-node-al2023-arm64"));
}

#[tokio::test]
async fn spot_prices_are_served_as_seeded() {
    let m = moto().await;
    m.seed_spot_prices(&[("m5.large", "us-east-1a", 0.0312), ("m5.large", "us-east-1b", 0.0333)]);
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let out = ec2
        .describe_spot_price_history()
        .instance_types(aws_sdk_ec2::types::InstanceType::M5Large)
        .send()
        .await
        .unwrap();
    let mut got: Vec<(String, String)> = out
        .spot_price_history()
        .iter()
        .map(|p| {
            (
                p.availability_zone().unwrap().to_string(),
                p.spot_price().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("us-east-1a".into(), "0.031200".into()),
            ("us-east-1b".into(), "0.033300".into())
        ]
    );
}
